"""lightning_gae.tensorboard.summary: the evolution strips it writes, each step once and at a constant size (the size
limit of every picture is tests/display/test_views.py's)."""


def _strip_steps_and_last(logdir, read_events, tag="gae_evolution/val_0"):
    events = read_events(logdir).Images(tag)
    return [e.step for e in events], [e.encoded_image_string for e in events]


def test_evolution_strips_come_every_evolution_length_steps_and_at_the_last_showing_each_step_once(tmp_path, read_events):
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from lightning_gae import explain
    from lightning_gae.modalities import ImageTokens
    from lightning_gae.tensorboard import TensorBoardViews
    from tests.helpers.models import small_vit

    torch.manual_seed(0)
    model, x = small_vit(), torch.rand(2, 1, 8, 8)
    explained = []
    for _ in range(7):  # seven steps of changing weights
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        explained.append(explain(model, x))

    def write(views, folder, steps, last_at):
        writer = SummaryWriter(str(tmp_path / folder))
        for step in steps:
            views.write([writer], step, modality=ImageTokens(patch_size=2), inputs=x, shown=x, sample_indices=[0, 1],
                        explanations={"gae": explained[step - 1]}, last=step in last_at)
        return writer

    views = TensorBoardViews(evolution_length=3)
    writer = write(views, "fit", range(1, 8), last_at=())
    views.write_strips([writer], 7)  # fit ended between the steps strips are written at
    views.write_strips([writer], 7)  # nothing more is due
    writer.close()
    steps, strips = _strip_steps_and_last(tmp_path / "fit", read_events)
    assert steps == [3, 6, 7]
    assert [e.step for e in read_events(tmp_path / "fit").Images("gae_heatmaps/val_0")] == list(range(1, 8))
    # The strip at step 7 shows steps 5, 6 and 7: the picture of a run that only saw those three, drawn at its last step.
    fresh = TensorBoardViews(evolution_length=3)
    write(fresh, "fresh", range(5, 8), last_at=(5, 7)).close()
    fresh_steps, fresh_strips = _strip_steps_and_last(tmp_path / "fresh", read_events)
    assert fresh_steps == [5, 7] and fresh_strips[-1] == strips[-1] and strips[0] != strips[1]
    # A strip with empty columns (step 5 alone) has the size of a full one.
    sizes = {(e.height, e.width) for e in read_events(tmp_path / "fresh").Images("gae_evolution/val_0")}
    assert len(sizes) == 1


def test_write_returns_the_pictures_it_writes_also_without_a_writer(tmp_path, read_events):
    # The loggers that are not TensorBoard get these (lightning_gae/callbacks/_loggers.py): the same pixels.
    import io

    import numpy as np
    import torch
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter

    from lightning_gae import explain
    from lightning_gae.modalities import ImageTokens
    from lightning_gae.tensorboard import TensorBoardViews
    from tests.helpers.models import small_vit

    torch.manual_seed(0)
    model, x = small_vit(), torch.rand(2, 1, 8, 8)
    arguments = dict(modality=ImageTokens(patch_size=2), inputs=x, shown=x, sample_indices=[3, 5],
                     explanations={"gae": explain(model, x)})
    writer = SummaryWriter(str(tmp_path))
    written = TensorBoardViews(evolution_length=2).write([writer], 1, last=False, **arguments)
    writer.close()
    alone = TensorBoardViews(evolution_length=2)
    drawn = alone.write([], 1, last=False, **arguments)
    assert sorted(drawn) == sorted(written) == ["gae_heatmaps/val_3", "gae_heatmaps/val_5"]
    events = read_events(tmp_path)
    for tag, picture in drawn.items():
        assert picture.dtype == np.uint8 and picture.shape[2] == 3
        np.testing.assert_array_equal(written[tag], picture)
        logged = np.asarray(Image.open(io.BytesIO(events.Images(tag)[-1].encoded_image_string)))
        np.testing.assert_array_equal(logged, picture)
    strips = alone.write_strips([], 1)
    assert sorted(strips) == ["gae_evolution/val_3", "gae_evolution/val_5"] and alone.write_strips([], 1) == {}


NAME = '<img src="x.png" onerror="alert(1)"> *spurious_word*'


def _text(read_events, logdir, tag):
    from tensorboard.util import tensor_util

    (event,) = read_events(logdir).Tensors(f"{tag}/text_summary")
    return tensor_util.make_ndarray(event.tensor_proto).reshape(-1)[0].decode("utf-8")


def test_user_names_in_the_text_tabs_alerts_and_tables_are_shown_literally(tmp_path, read_events):
    """A region, method or metric name goes into the Text tab's markdown escaped: TensorBoard's sanitiser would keep
    an ``<img>`` of it, and markdown would read its ``*`` and ``_`` as emphasis."""
    from tensorboard import plugin_util
    from torch.utils.tensorboard import SummaryWriter

    from lightning_gae.tensorboard import faithfulness_table
    from lightning_gae.tensorboard.summary import write_alerts

    writer = SummaryWriter(str(tmp_path))
    headline = f"step 3: 60% of gae's relevance sits on the suspect region {NAME!r}"
    write_alerts([writer], 3, [(NAME, "gae", f"**{headline}**\n\n- samples most affected: 1, 2")])
    writer.close()
    html = plugin_util.markdown_to_safe_html(_text(read_events, tmp_path, "gae_alerts"))
    assert "<img" not in html and "<em>" not in html
    assert "&lt;img src=\"x.png\" onerror=\"alert(1)\"&gt; *spurious_word*" in html
    assert html.startswith("<p><strong>step 3") and "<li>samples most affected: 1, 2</li>" in html

    table = faithfulness_table({f"{NAME}/gae": 0.5, f"positive_perturbation_auc/{NAME}": 0.25})
    html = plugin_util.markdown_to_safe_html(table)
    assert "<img" not in html and html.count("&lt;img src=\"x.png\" onerror=\"alert(1)\"&gt; *spurious_word*") == 2
