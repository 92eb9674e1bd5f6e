from PIL import Image

from eval.plots import plot_coord_check, plot_exits, plot_skip


def assert_png(path, min_colours=3):
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 300
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) >= min_colours  # not blank


def test_exit_plot_takes_models_of_different_depths(tmp_path):
    reports = [{"label": "dense", "exit_loss": {"1": 7.0, "2": 5.0, "3": 3.0}},
               {"label": "dropout", "exit_loss": {str(k): 4.0 - 0.2 * k for k in range(1, 7)}}]
    assert_png(plot_exits(reports, tmp_path / "sub" / "exits.png"))


def test_skip_plot_marks_the_alternating_sets(tmp_path):
    rows = [{"skip_layers": [], "loss": 3.0, "params_kept": 100, "name": "none"},
            {"skip_layers": [1], "loss": 3.5, "params_kept": 80, "name": "alternate-odd"},
            {"skip_layers": [0], "loss": 5.0, "params_kept": 80, "name": "0"}]
    assert_png(plot_skip([{"label": "a", "results": rows}, {"label": "b", "results": rows[:2]}],
                         tmp_path / "skip.png"))


def test_coord_check_plot_has_a_panel_per_r_train(tmp_path):
    series = [{"r_train": r, "density": d, "step": s, "rms": 0.1 * (s + 1) * (d if r == "one" else 1)}
              for r in ("one", "inverse_density") for d in (0.5, 1.0) for s in range(3)]
    path = plot_coord_check({"series": series}, tmp_path / "cc.png")
    with Image.open(path) as image:
        assert image.size[0] > image.size[1] * 2  # two panels side by side
    assert_png(path)
