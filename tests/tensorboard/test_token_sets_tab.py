"""The GAE tab on a model with several token sets: a real short fit of the seq2seq recipe's encoder-decoder,
its event files served by a real ``tensorboard`` and drawn by a real Chromium."""

from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import seed_everything

from lightning_gae.callbacks import EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.methods import get_method
from recipes.seq2seq import CopyTaskDataModule, CopyTokens, Seq2SeqCopier
from recipes.tensorboard_screenshots import DASHBOARD, Chromium, find_chromium
from tests.helpers.processes import get_json, tensorboard_server

METHODS = ("gae", "attn_gradcam")


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory, make_trainer, read_events):
    """One epoch of the copy task (sources of 10 tokens, 7 target positions), explained once, with the recipe's
    vocabulary (``<bos>``, ``s3``, ``d1``, ...), as ``configs/seq2seq.yaml`` sets it up."""
    root = tmp_path_factory.mktemp("s2s_tab")
    seed_everything(0)
    tokens = CopyTokens(num_symbols=20, num_distractors=8)
    callback = GAECallback(num_samples=2, methods=METHODS, query="last",
                           modality={"encoder": tokens, "decoder": tokens},
                           faithfulness=FaithfulnessOptions(metrics=(), random_baseline=False),
                           engine=EngineOptions(set_inputs={"encoder": "src", "decoder": "tgt_in"}))
    model = Seq2SeqCopier(d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32)
    data = CopyTaskDataModule(num_train=128, num_val=32, source_length=10, copy_length=6, batch_size=16)
    trainer = make_trainer(root, [callback], name="s2s", max_epochs=1, limit_val_batches=1)
    trainer.fit(model, data)
    index = torch.tensor(callback.sample_indices)
    batch = {k: v[index] for k, v in data.val_set.tensors.items()}
    logdir = Path(trainer.logger.log_dir)
    with tensorboard_server(logdir.parent) as base:
        yield {"logdir": logdir, "acc": read_events(logdir), "callback": callback, "model": model, "batch": batch,
               "tokens": tokens, "plugin": f"{base}/data/plugin/gae", "base": base}


@pytest.mark.slow
def test_the_plugin_serves_every_token_set_with_its_token_strings(seq2seq):
    s, acc, tokens, batch = seq2seq, seq2seq["acc"], seq2seq["tokens"], seq2seq["batch"]
    name = s["logdir"].name
    info = get_json(f"{s['plugin']}/run?run={name}")
    step = info["steps"][-1]
    at = get_json(f"{s['plugin']}/step?run={name}&step={step}")
    with torch.no_grad():
        predicted = s["model"].eval()(batch["src"], batch["tgt_in"]).argmax(-1)
    assert [x["sample"] for x in info["samples"]] == s["callback"].sample_indices
    for k, sample in enumerate(info["samples"]):
        # Both sets, source first, each with the vocabulary's strings (not ids).
        sets = {x["set"]: x for x in sample["sets"]}
        assert [x["set"] for x in sample["sets"]] == ["encoder", "decoder"]
        assert sets["encoder"]["input"]["tokens"] == tokens.token_strings(batch["src"][k])
        assert sets["decoder"]["input"]["tokens"] == tokens.token_strings(batch["tgt_in"][k])
        assert sets["decoder"]["query"] and not sets["encoder"]["query"]
        assert any(t.startswith("s") for t in sets["encoder"]["input"]["tokens"])
        # The explained class is a token of the vocabulary, so the title names it by its string.
        assert sample["class_names"] == tokens.token_strings(list(range(31)))

        served = at["samples"][str(sample["sample"])]
        assert served["row_labels"] == tokens.token_strings(predicted[k])
        for method in METHODS:
            for x, width in (("encoder", 10), ("decoder", 7)):
                rows = served["rows"][x][method]
                logged = acc.tensor(f"gae_dashboard/set_rows/{method}/{x}/val_{sample['sample']}")
                assert rows["shape"] == [7, width]
                np.testing.assert_allclose(np.reshape(rows["values"], (7, width)), logged, rtol=1e-6)
                # Every row that is zero everywhere is named, with why; none other.
                zero = [t for t in range(7) if not np.any(logged[t])]
                assert rows.get("zero_rows", []) == zero
                if zero:
                    assert rows["zero_reason"] == get_method(method).all_zero
                by_set = served["sets"][x][method]
                whole = acc.tensor(f"gae_dashboard/set_relevance/{method}/{x}/val_{sample['sample']}")
                assert ("all_zero" in by_set) == (not np.any(whole))
        # A causal decoder's first position sees only itself, which its own relevance leaves out: zero everywhere.
        assert 0 in served["rows"]["decoder"]["gae"]["zero_rows"]


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_chromium_shows_the_source_tokens_and_a_matrix_per_set(seq2seq):
    s, tokens, batch = seq2seq, seq2seq["tokens"], seq2seq["batch"]
    first = s["callback"].sample_indices[0]
    with Chromium(find_chromium(), width=1400, height=1000) as browser:
        page = browser.open(f"{s['base']}/#gae")
        page.wait_for(f"{DASHBOARD}.querySelector('#gae-dashboard[data-rendered-step]')")
        sample = f"{DASHBOARD}.querySelector('.gae-sample[data-sample=\"{first}\"]')"
        source = page.evaluate(f"{sample}.querySelector('.gae-set-tokens[data-set=encoder]').textContent")
        assert source == "encoder: " + " ".join(tokens.token_strings(batch["src"][0]))
        # One matrix per method and set; the source matrix's columns are the source tokens, its rows the targets.
        assert page.evaluate(f"{sample}.querySelectorAll('table.gae-matrix').length") == 2 * len(METHODS)
        columns = page.evaluate(f"[...{sample}.querySelectorAll('table.gae-matrix[data-method=gae][data-set=encoder] th.gae-col')]"
                                ".map((th) => th.textContent)")
        assert columns == tokens.token_strings(batch["src"][0])
        rows = page.evaluate(f"[...{sample}.querySelectorAll('table.gae-matrix[data-method=gae][data-set=encoder] th.gae-row')]"
                             ".map((th) => th.textContent)")
        assert len(rows) == 7 and all(r.split(": ")[1].rstrip(" ∅") in tokens.vocab for r in rows)
        # The decoder's first row is zero everywhere: marked, and hovering its label says why.
        assert page.evaluate(f"{sample}.querySelector('table.gae-matrix[data-method=gae][data-set=decoder] th.gae-zero-row')"
                             ".textContent").startswith("0: ")
        assert page.script_errors() == []
