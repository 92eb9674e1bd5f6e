"""The shared eval flags' helpers: one name per checkpoint, whichever form a command reads."""

from eval.options import checkpoint_label, checkpoint_labels


def test_a_runs_checkpoint_and_its_export_have_one_name():
    """The same run was `tiny` (eval exits), `last.ckpt` (eval dynamic) or `export`."""
    forms = ["runs/tiny/checkpoints/last.ckpt", "runs/tiny/checkpoints/step-00000300.ckpt", "runs/tiny/export"]
    assert {checkpoint_label(path) for path in forms} == {"tiny"}
    assert checkpoint_label("models/tiny-llama") == "tiny-llama"  # a Hugging Face folder: its own name
    assert checkpoint_label("loose.ckpt") == "loose"


def test_several_checkpoints_of_one_run_get_distinct_names():
    assert checkpoint_labels(["runs/x/checkpoints/last.ckpt", "runs/x/export"]) == ["x/last", "x/export"]
    assert checkpoint_labels(["runs/dense/export", "runs/ild/export"]) == ["dense", "ild"]
