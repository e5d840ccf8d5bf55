import json

from lightning_gae import METHODS
from lightning_gae.cli import main


def test_bench_prints_a_ratio_per_method(capsys):
    main(["bench", "--batch-size", "2", "--image-size", "8", "--patch-size", "4", "--dim", "16",
          "--depth", "2", "--heads", "2", "--repeats", "1", "--device", "cpu"])
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["tokens"] == 5 and report["batch_size"] == 2
    assert set(report["ratio_to_forward_backward"]) == set(METHODS)
    assert all(r > 0 for r in report["ratio_to_forward_backward"].values())
