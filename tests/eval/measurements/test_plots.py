import pytest
from PIL import Image

from eval.measurements.plots import plot_coord_check, plot_exits, plot_skip


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


def _segments(ax):
    return [list(line.get_xdata()) for line in ax.lines]


def test_no_line_is_drawn_through_exits_without_a_value():
    from eval.measurements.plots import exits_figure

    adapters = {"label": "with exit adapters", "exit_loss": {"2": 4.0, "4": 3.5, "5": 3.4, "6": 3.0}}
    plain = {"label": "plain", "exit_loss": {str(k): 5.0 - 0.3 * k for k in range(1, 7)}}
    fig = exits_figure([plain, adapters])
    segments = _segments(fig.axes[0])
    assert [1, 2, 3, 4, 5, 6] in segments  # every exit present: one line
    assert [2] in segments and [4, 5, 6] in segments  # exit 3 has no adapter: no line from 2 to 4
    assert not any(2 in s and 4 in s for s in segments[1:])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["plain", "with exit adapters"]  # one legend entry per series


def test_every_skip_set_is_identifiable():
    from eval.measurements.plots import skip_figure

    rows = [{"skip_layers": [], "loss": 3.0, "params_kept": 100, "name": "none"},
            {"skip_layers": [2, 3], "loss": 3.6, "params_kept": 60, "name": "2-3"},
            {"skip_layers": [1, 3], "loss": 3.4, "params_kept": 60, "name": "alternate-odd"}]
    rows += [{"skip_layers": [i], "loss": 3.2 + 0.1 * i, "params_kept": 80, "name": str(i)} for i in range(6)]
    fig = skip_figure([{"label": "a", "num_layers": 6, "results": rows}])
    left, right = fig.axes
    singles = right.lines[0]
    assert list(singles.get_xdata()) == [0, 1, 2, 3, 4, 5]  # by the layer skipped, not all at 80 params
    assert list(singles.get_ydata()) == pytest.approx([3.2 + 0.1 * i for i in range(6)])
    assert [list(line.get_xdata()) for line in left.lines] == [[60, 100]]  # the middle line: 2-3, then none
    assert [t.get_text() for t in left.texts] == ["alternate-odd"]  # same parameters as 2-3, told apart


def test_the_exit_plot_draws_each_models_full_depth_and_names_the_uniform_guess():
    """exits.png spanned 0.07 nats with nothing to read it against: flat because the exits are
    robust, or because the model barely trained?"""
    from eval.measurements.plots import exits_figure

    dense = {"label": "dense", "num_layers": 3, "ln_vocab": 9.011, "exit_loss": {"1": 6.12, "2": 6.08, "3": 6.05}}
    ild = {"label": "ILD", "num_layers": 3, "ln_vocab": 9.011, "exit_loss": {"1": 6.09, "2": 6.07, "3": 6.06}}
    ax = exits_figure([dense, ild]).axes[0]
    across = [line.get_ydata()[0] for line in ax.lines if line.get_linestyle() == ":" and len(line.get_ydata())]
    assert sorted(across) == [6.05, 6.06]  # each model's exit L, drawn across
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dense", "ILD", "each model's full depth (exit L)"]
    assert "uniform guess ln V = 9.01" in ax.get_ylabel() and "nats/token" in ax.get_ylabel()
