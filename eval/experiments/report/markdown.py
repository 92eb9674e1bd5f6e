"""The Markdown of `layerdrop report`, rendered from report.json's content alone."""

from __future__ import annotations

from typing import Any

from eval.experiments.report.choosing import markdown_table
from eval.experiments.report.own_optimum import markdown_section
from eval.experiments.report.page_table import p_text as _p, table as _table
from eval.experiments.report.projection import judged_markdown


def _f(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _flops(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _comparison(c: dict) -> str:
    se = f" ± {c['se']:.4f}" if c.get("se") is not None else ""
    how = []
    if c.get("paired"):
        how.append(f"paired over {c['paired']} seeds")
    if c.get("p_value") is not None:
        how.append(f"p = {_p(c['p_value'])}" + (f", Holm {_p(c['p_holm'])}" if c.get("p_holm") is not None else ""))
    text = f"{c['a']} vs {c['b']}: {c['diff']:+.4f} ({c['pct']:+.2f}%){se}" + (f" ({'; '.join(how)})" if how else "")
    text += f" → {c['verdict']}"
    if c.get("verdict_holm") and c.get("p_holm") is not None and c["verdict_holm"] != c["verdict"]:
        text += f" (after Holm: {c['verdict_holm']})"
    if c.get("seeds_beyond") and c.get("seed_sigma") is not None and (
            (c.get("p_value") or 0) >= 0.05 or (c.get("p_holm") or 0) >= 0.05):
        gaps = ", ".join(f"{g:+.4f}" for g in (c.get("seed_gaps") or {}).values())
        text += f" [every seed {c['seeds_beyond']} by > 2σ = {2 * c['seed_sigma']:.4f}: {gaps}]"
    other = c.get("alternative")
    if other and other["verdict"] != c["verdict"]:
        se = f" ± {other['se']:.4f}" if other.get("se") is not None else ""
        p = f", p = {_p(other['p_value'])}" if other.get("p_value") is not None else ""
        text += f" [other analysis, flagged spread out of the pool: {other['diff']:+.4f}{se}{p} → {other['verdict']}]"
    if c.get("paper_pct") is not None:
        text += f"; paper {c['paper_pct']:+.2f}% ({c['paper_source']})"
        text += f": {c['vs_paper']}" if c.get("vs_paper") else ""
    return f"*observation:* {text}" if c.get("observation") else text


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _correlation(name: str, test: dict, achieved: dict | None) -> str:
    """Finding 6's test: nominal P̄ (when the report has it), the achieved P̄'s beside."""
    nominal = test.get("p_bar") == "mean_dropout_predicted"
    text = (f"{name.replace('_', ' ')}{' vs nominal P̄' if nominal else ''}: ρ = {test['spearman']:+.2f}, "
            f"p = {_p(test['p_value'])}" + (f" (Holm {_p(test['p_holm'])})" if test.get("p_holm") is not None else "")
            + f", {test.get('configurations', '?')} configurations"
            + (f" at {test['distinct_p_bar']} P̄ levels" if nominal else "") + f" ({_count(test['runs'], 'run')})")
    if achieved:
        text += f"; *beside it, vs achieved P̄*: ρ = {achieved['spearman']:+.2f}, p = {_p(achieved['p_value'])}"
    return text


def _how_it_was_run(report: dict) -> list[str]:
    machine = report.get("machine") or {}
    runs = report["runs"]
    lines = ["## How it was run", ""]
    commands = []
    if report.get("prepare"):
        commands.append("# the data (the sweep prepares it when its folder is missing):")
        commands.append(" ".join(["layerdrop", "prepare", *report["prepare"], "--out", "DATA_DIR"]))
    commands += machine.get("commands", [])
    if report.get("report_command"):
        commands.append(report["report_command"])
    if commands:
        lines += ["```bash", *commands, "```", ""]
    if machine.get("host"):
        host = machine["host"]
        gpus = f", GPUs: {', '.join(host['gpus'])}" if host.get("gpus") else ", no GPU"
        lines.append(f"Machine: {host.get('cpu', '?')}, {host.get('cores', '?')} cores, "
                     f"{host.get('memory_gb', '?')} GiB{gpus}; Python {machine.get('python', '?')}, "
                     f"torch {machine.get('torch', '?')}; {_count(machine.get('jobs', '?'), 'run')} at a time, "
                     f"{_count(machine.get('threads_per_job', '?'), 'thread')} each.")
        lines.append("")
    lines += _data_lines(report.get("data") or {})
    for shape in (report.get("model") or {}).get("shapes", []):
        lines.append(f"Model: d = {shape['d_model']}, L = {shape['n_layers']}, {shape['n_heads']} heads, vocabulary "
                     f"{shape['vocab_size']:,}; {shape['non_embedding_params']:,} non-embedding parameters; "
                     f"{shape['steps']:,} steps × {shape['batch_size']} sequences × {shape['seq_len']} tokens = "
                     f"{shape['tokens']:,} tokens = **{shape['tokens_per_parameter']:.1f} tokens per "
                     f"non-embedding parameter** ({_count(shape['runs'], 'run')}).")
        lines.append("")
    cpu = sum(r["cpu_seconds"] for r in runs)
    cores = (machine.get("host") or {}).get("cores")
    machine_hours = f"= {cpu / 3600 / cores:.2f} hours of its {cores}-core machine; " if cores else ""
    lines.append(f"{_count(len(runs), 'run')}; {cpu / 3600:.2f} CPU-hours in all for training and evaluations, "
                 f"measured as each subprocess's CPU time ({machine_hours}wall time depends on what else runs).")
    if report.get("skipped_runs"):
        lines += ["", "Runs not in this report (unfinished or failed): " + "; ".join(report["skipped_runs"])]
    return lines + [""]


def _data_lines(data: dict) -> list[str]:
    """What the runs read (build.data_read): nothing where no run records it (older runs)."""
    identities, unrecorded = data.get("identities") or [], data.get("unrecorded") or []
    if not identities:
        return []
    older = (f" ({len(unrecorded)} {'run predates' if len(unrecorded) == 1 else 'runs predate'} the record)"
             if unrecorded else "")

    def described(identity: dict) -> str:
        folders = []
        for name, record in identity.items():
            splits = ", ".join(f"{split} {counts.get('tokens') or 0:,} tokens / {counts.get('documents') or 0:,} "
                               f"documents" for split, counts in (record.get("splits") or {}).items())
            folders.append(f"{name}: tokenizer sha256 {str(record.get('tokenizer_sha256'))[:12]}…, {splits}")
        return "; ".join(folders)

    if len(identities) == 1:
        return [f"Data: every run that records it read the same{older}: {described(identities[0]['identity'])}.", ""]
    lines = [f"**Data: the runs read {len(identities)} different data**{older}; comparisons across them mix "
             "corpora or tokenizers:", ""]
    lines += [f"- {described(group['identity'])}: {', '.join(group['runs'])}" for group in identities]
    return lines + [""]


def _findings(report: dict) -> list[str]:
    if all(f["verdict"] in ("not tested", "not tested here") for f in report["findings"]):
        # a tuning or transfer sweep: dense runs only, nothing of the paper's to check
        return ["## The paper's findings at this scale", "",
                "None is tested: the sweep has no configurations a finding can be checked on.", ""]
    tests = report.get("multiple_comparisons") or {}
    lines = ["## The paper's findings at this scale", "",
             "Each claim is tested at the paper's own setting, with the paper's figure beside ours "
             "(eval/experiments/report/findings/). A comparison a − b is paired over the seeds a and b share (the "
             "mean of the per-seed differences), else unpaired; its noise is pooled over every configuration, none "
             "left out (docs/RULES.md, significance.py), and its verdict a two-sided Student-t test at α = 0.05; a "
             "comparison whose every seed lies beyond the other side by more than 2 pooled σ is never "
             "\"within noise\" (shown as [every seed …]), and where a configuration's spread is flagged the other "
             "analysis (it out of the pool, on its own spread) is shown beside where it differs. **reproduced**: every "
             "comparison goes the paper's way; **not reproduced**: one goes the other way, beyond the paper's own "
             "figure where it reports one; **consistent with the paper's own figure**: those going the other way "
             "are within the noise of (or below) the loss the paper reports; **within noise**: neither. "
             "*Observations* are shown, not counted.", ""]
    if tests.get("tests"):
        lines += [f"This page makes **{tests['tests']} tests** (the comparisons below that decide a verdict, the "
                  "correlation tests, and the table's comparisons with dense). If no difference were real, about "
                  f"{tests['expected_by_chance']:.1f} of them would cross α = {tests['alpha']} by chance; the "
                  "\"after Holm\" column judges each against Holm's adjustment over all of them, which keeps the "
                  "chance of any false call at 5%.", ""]
    rows = []
    for f in report["findings"]:
        numbers = [_comparison(c) for c in f["comparisons"]]
        if f.get("correlations"):
            numbers = [_correlation(k, v, f.get("achieved_correlations", {}).get(k))
                       for k, v in f["correlations"].items()]
        for group in f.get("optima") or []:
            optima = ", ".join(_optimum(o) for o in group["optima"])
            grid = f", grid {group['grid']}" if group.get("grid") else ""
            edge = "; an optimum at the grid's edge" if group.get("at_edge") else ""
            family = f" ({group['family']})" if group.get("family") not in (None, "all runs") else ""
            numbers.insert(0, f"{SYMBOLS.get(group['key'], group['key'])} optimum per p_max, r_train = "
                              f"{group['r_train']}{family}{grid}: {optima} → {group['verdict']}{edge}")
        if f.get("no_baseline"):
            numbers.append("no compute-matched baseline for: " + ", ".join(f["no_baseline"]))
        test = f"{f['test']} ({f['note']})" if f.get("note") else f["test"]
        rows.append([f["claim"], f.get("paper") or "–", test, f"**{f['verdict']}**", f.get("verdict_holm") or "–",
                     "<br>".join(numbers) or "–"])
    return lines + _table(["paper", "the paper's figure", "tested here as", "verdict", "after Holm",
                           "numbers (a − b in loss, ± 1 SE)"], rows) + [""]


def _optimum(o: dict) -> str:
    """One p_max's optimum on a Fig. 3 curve, with its seeds and where it sits against dense's."""
    position = o.get("position")
    extra = "" if position in (None, "reference", "same") else f"; {position}"
    seeds = f" ({o['seeds']} seed{'s' if o['seeds'] != 1 else ''}{extra})" if "seeds" in o else ""
    return f"{o['p_max']}: {o['optimum']:g}{seeds}"


def _budgets(report: dict) -> list[str]:
    section = report.get("budgets")
    if not section:
        return []
    budgets = section["budgets"]
    names = ", ".join(f"{b['tokens_per_parameter']:.1f} TPP ({b['source']})" for b in budgets)
    lines = ["## Across budgets (Fig. 8's view)", "",
             f"The same comparisons at {names}: a − b in % of b's loss ± 1 SE at each budget (its verdict after "
             "Holm on its own page), and the change of a − b from the smallest budget to the largest, tested "
             f"two-sided at α = {section['alpha']} with the errors of both added "
             "(eval/experiments/report/budget_trend.py). "
             "The paper's Fig. 8 finds the ILD+DTS gap to dense stable across budgets. *Observations* in italics.", ""]
    rows = []
    for row in section["rows"]:
        cells = {p["tokens_per_parameter"]: p for p in row["points"]}
        at = []
        for budget in budgets:
            point = cells.get(budget["tokens_per_parameter"])
            at.append("–" if point is None or point["pct"] is None else
                      f"{point['pct']:+.2f}%" + (f" ± {point['pct_se']:.2f}" if point["pct_se"] is not None else "")
                      + f" ({point['verdict']})")
        metric = "" if row["metric"] == "val_loss" else f" [{row['metric'].replace('_', ' ')}]"
        name = f"{row['a']} vs {row['b']}{metric}"
        se = f" ± {row['change_se']:.4f}" if row["change_se"] is not None else ""
        p = f", p = {_p(row['p_value'])}" if row["p_value"] is not None else ""
        verdict = f"**{row['verdict']}**"
        if row.get("seeds_apart") and (row["p_value"] is None or row["p_value"] >= section["alpha"]):
            verdict += " (every seed beyond the other budget's gap by > 2σ)"
        other = row.get("alternative")
        if other and other["verdict"] != row["verdict"]:
            verdict += f"; other analysis (flagged spread out of the pool): {other['verdict']}" + (
                f", p = {_p(other['p_value'])}" if other.get("p_value") is not None else "")
        rows.append([row["finding"], f"*{name}*" if row["points"][0]["observation"] else name, *at,
                     f"{row['change']:+.4f}{se}{p}", verdict])
    lines += _table(["finding", "comparison", *(f"{b['tokens_per_parameter']:.1f} TPP" for b in budgets),
                     "change of a − b (nats)", "verdict"], rows)
    image = report.get("images", {}).get("budgets")
    if image:
        lines += ["", f"![budgets]({image})"]
    return lines + [""]


def _own_optimum(report: dict) -> list[str]:
    return markdown_section(report.get("own_optimum"))


def _projection(report: dict) -> list[str]:
    return judged_markdown(report["projection"]) if report.get("projection") else []


def _choosing(report: dict) -> list[str]:
    table = report.get("choosing")
    if not any(row["p_max"] > 0 for row in table or []):
        return []
    return ["## Choosing a configuration", "",
            "ILD+DTS (the paper's recommended form) at each p_max and budget, and beside it at the same P̄ the "
            "schedule increasing (ILD+ITS) or constant (ILD) over time, ILD+DTS with r_train = 1 and with the "
            "early-exit loss, read from the findings above (and those of every `--across` report): %Δ of the "
            "held-out loss ± 1 SE in % of dense's, with the verdict after Holm where the comparison is one of the "
            "page's tests, and its raw verdict marked \"raw\" where it is an observation; FLOPs saved against a "
            "plain dense run, non-embedding (the blocks, the paper's) / total (blocks, unembedding, early-exit "
            "heads; negative: it costs more); equal FLOPs: against the dense run trained to the same FLOPs with "
            "its own schedule; middle-exit gain: the exit loss at L/2 minus dense's (minus its twin's without the "
            "loss for the early-exit loss; negative: better). Dense's row gives its loss (mean ± std over seeds). "
            "The \"Choosing a configuration\" table of docs/guide/reproducing.md is this one "
            "(eval/experiments/report/choosing.py).", "",
            *markdown_table(table), ""]


def _configurations(report: dict) -> list[str]:
    noise = report["noise"]
    lines = ["## Configurations (Table 2/3 form)", "",
             "Validation loss: `eval heldout` on the held-out split (mean ± std over seeds); %Δ vs the dense "
             f"configuration with the same settings ({noise.get('baseline') or 'dense'} for most), at α = "
             f"{noise.get('alpha', 0.05)} (paired over shared seeds); a compute-matched dense run is trained to "
             "the FLOPs of the configurations named, in the convention named. Training FLOPs in both conventions, "
             "each with the share it saves against a plain dense run of the same tokens: **non-embedding** (the "
             "blocks only: the paper's FLOPs, the share P̄ saves) and **total** (blocks, unembedding and every "
             "early-exit head: what the run costs; negative: it costs more). Totals marked † are rebuilt from "
             "the recipe (a summary.json written before the conventions were named holds the blocks only).", ""]
    rows = []
    for row in report["configurations"]:
        vs = row.get("vs_dense")
        std = f" ± {row['val_loss_std']:.4f}" if row["val_loss_std"] is not None else ""
        on = f" ({', '.join(row['matched_on'])} FLOPs)" if row.get("matched_on") else ""
        against = vs["verdict"] if vs else "FLOPs of " + "; ".join(row["compute_matched_to"]) + on \
            if row.get("compute_matched_to") else "baseline" if "dense" in row["configuration"] else "–"
        rebuilt = "†" if row.get("total_flops_from") == ["recipe"] else ""
        total = row.get("total_training_flops")
        rows.append([row["configuration"], str(row["seeds"]), _f(row.get("steps")),
                     _f(row["mean_dropout_predicted"], 3),
                     _f(row["mean_dropout_achieved"], 3), _flops(row["training_flops"]),
                     f"{row['training_flops_saved_pct']:.1f}%", "missing" if total is None else _flops(total) + rebuilt,
                     "–" if row.get("total_flops_saved_pct") is None else f"{row['total_flops_saved_pct']:.1f}%",
                     f"{_f(row['val_loss_mean'])}{std}", f"{vs['pct']:+.2f}%" if vs else "–", against])
    lines += _table(["configuration", "seeds", "steps", "P̄ predicted", "P̄ achieved", "non-embedding FLOPs",
                     "saved", "total FLOPs", "saved", "val loss", "%Δ", "vs dense"], rows)
    return lines + [""]


def _noise(report: dict) -> list[str]:
    noise = report["noise"]
    runs = [r for r in report["runs"] if r["heldout_standard_error"] is not None]
    lines = ["## Noise", ""]
    if noise.get("seed_std") is not None:
        lines.append(f"- Seed noise: σ = {noise['seed_std']:.4f} nats (pooled std over seeds of the configurations "
                     f"run with several seeds, {noise['seed_dof']} degrees of freedom): the noise of unpaired "
                     "differences.")
    if noise.get("residual_std") is not None:
        lines.append(f"- Paired noise: σ = {noise['residual_std']:.4f} nats, the residual std of loss = configuration "
                     f"+ seed fitted over every run ({noise['residual_dof']} degrees of freedom): a per-seed "
                     "difference's noise is σ·√2.")
    other = noise.get("without_flagged") or {}
    for u in noise.get("flagged") or []:
        seeds = " / ".join(f"{v:.4f}" for v in u.get("per_seed") or [])
        without = (f" (without it: seed σ {other['seed_std']:.4f}, paired σ {other['residual_std']:.4f})"
                   if other.get("seed_std") is not None and other.get("residual_std") is not None else "")
        lines.append(f"- **Spread beyond the others (flagged)**: {u['configuration']} spreads σ = {u['std']:.4f} nats "
                     f"over its {u['seeds']} seeds ({seeds}) against {u['others_std']:.4f} pooled over every other "
                     f"configuration (F test, p = {_p(u['p_value'])}, beyond α divided by the configurations tested). "
                     f"It stays in both pooled estimates above{without} and every verdict is the pooled one "
                     "(docs/RULES.md); the other analysis, it out of the pool and its comparisons on its own spread "
                     "(Welch), is shown beside each comparison where its verdict differs.")
    if runs:
        tokens = sorted({r["heldout_tokens"] for r in runs})
        errors = [r["heldout_standard_error"] for r in runs]
        slices = sorted({r["heldout_slices"] for r in runs})
        lines.append(f"- Evaluation noise: the held-out loss of a run is measured on {', '.join(f'{t:,}' for t in tokens)} "
                     f"tokens with a standard error of {min(errors):.4f}–{max(errors):.4f} nats (from "
                     f"{', '.join(map(str, slices))} consecutive slices); the "
                     f"difference between two runs on the same tokens is much less noisy: its paired standard "
                     f"error has median {_f(noise.get('evaluation_se_median'))} nats over the comparisons with dense "
                     "(added to an unpaired difference's noise; a paired one holds it already).")
    diffs = [abs(r["val_loss"] - r["end_of_training_val_loss"]) for r in report["runs"]
             if r["val_loss"] is not None and r["end_of_training_val_loss"] is not None]
    sizes = sorted({r["training_val_tokens"] for r in report["runs"] if r.get("training_val_tokens")})
    if diffs:
        size = f"{', '.join(f'{t:,}' for t in sizes)} tokens spread over the split" if sizes else "its val set"
        lines.append(f"- The end-of-training validation ({size}) differs from the "
                     f"held-out loss by {min(diffs):.4f}–{max(diffs):.4f} nats across runs; comparisons use the "
                     "held-out loss.")
    return lines + [""]


def _images(report: dict) -> list[str]:
    captions = {
        "pareto": "Validation loss vs non-embedding training FLOPs executed, every run (Fig. 9's view); "
                  "a marker ends each run.",
        "exits": "Early-exit loss of every configuration, mean over its seeds (Figs 5, A.2).",
        "skip": "Layer skipping (Fig. A.3): several middle layers by parameters kept (left; diamonds: "
                "alternate layers), and every single layer (right).",
        "degradation": "The third claim: early-exit and skip degradation vs P̄, one point per run.",
        "heatmaps": "p(ℓ, t) of each distribution × schedule in the sweep.",
    }
    lines = ["## Plots", ""]
    for name, path in report.get("images", {}).items():
        if name.startswith("loss_vs_") or name == "budgets":  # shown with their tables
            continue
        lines += [f"![{name}]({path})", "", captions.get(name, ""), ""]
    return lines


SYMBOLS = {"model.parametrization.lr": "η", "model.decoder.init_std": "σ", "model.parametrization.tau_ema": "τ_EMA"}


def _point(point: dict, best: bool) -> str:
    if point["mean"] == float("inf"):
        return "diverged"
    text = f"{point['mean']:.4f}" + (f" ± {point['std']:.4f}" if point.get("std") is not None else "")
    text += f" ({point['seeds']})"
    return f"**{text}**" if best else text


def _hyperparameters(report: dict) -> list[str]:
    """Loss vs η, σ, τ_EMA per series; the µTransfer drift; Fig. 3's verdict; rising validation."""
    section = report.get("hyperparameters") or {}
    lines: list[str] = []
    for key, curves in (section.get("curves") or {}).items():
        symbol = SYMBOLS.get(key, key)
        values = sorted({p["value"] for c in curves for p in c["points"]})
        lines += [f"## Loss vs {symbol} (`{key}`)", "",
                  "Mean held-out loss over seeds ± their std (number of seeds); **bold**: each series' optimum.", ""]
        rows = []
        for value in values:
            row = [f"{value:g}" if isinstance(value, (int, float)) else str(value)]
            for curve in curves:
                point = next((p for p in curve["points"] if p["value"] == value), None)
                row.append(_point(point, point is curve["points"][curve["optimum_index"]]) if point else "")
            rows.append(row)
        lines += _table([symbol, *(c["label"] for c in curves)], rows) + [""]
        edges = [c["label"] for c in curves if c["at_edge"]]
        if edges:
            lines += [f"Optimum at the edge of the grid (the true one may lie beyond): {'; '.join(edges)}.", ""]
        image = report.get("images", {}).get(f"loss_vs_{key.split('.')[-1]}")
        if image:
            lines += [f"![loss vs {symbol}]({image})", ""]
    if section.get("transfer"):
        lines += ["## µTransfer: the optimal η_base per shape", "",
                  "Drift: log₂ of the optimum over the reference shape's (the parametrization's base, d_base × "
                  "n_layers_base, where it ran; else the smallest shape), per parametrization (0: the optimum "
                  "stays put; ±1: one factor of 2). Regret: the loss at the reference's optimal η minus the loss "
                  "at this shape's own optimum (what trusting the transfer costs here).", ""]
        rows = [[str(r["parametrization"]), _f(r["d_model"]), _f(r["n_layers"]) + (" (ref.)" if r.get("reference") else ""),
                 f"{r['optimal_lr']:g}", _f(r["loss"]), f"{r['drift_log2']:+.2f}" + (" (edge)" if r["at_edge"] else ""),
                 _f(r.get("loss_at_transferred")), "–" if r.get("regret") is None else f"{r['regret']:+.4f}"]
                for r in section["transfer"]]
        lines += _table(["parametrization", "d_model", "n_layers", "optimal η", "loss", "drift (log₂)",
                         "loss at the reference's η", "regret"], rows) + [""]
        for verdict in section.get("transfer_verdicts") or []:
            edge = " (an optimum at the grid's edge)" if verdict["edge"] else ""
            lines.append(f"- {verdict['parametrization']}: {verdict['verdict']}{edge}")
        lines.append("")
    if section.get("figure3"):
        lines += ["## Fig. 3: does the optimum stay put across p_max?", ""]
        lines += ["Per family (r_train and the schedule), each p_max's optimum against the dense one's: the same "
                  "grid point, or elsewhere and *moved* (its loss at the dense optimum above its best by more than "
                  "2σ·√(1/n₁ + 1/n₂), ≥ 2 seeds at both), *tied* (within that) or *undecided* (why).", ""]
        rows = [[SYMBOLS.get(f["key"], f["key"]), f["r_train"], f.get("family") or "–",
                 "; ".join(f"p_max={_optimum(o)}" for o in f["optima"]), f["verdict"]]
                for f in section["figure3"]]
        lines += _table(["curve", "r_train", "family", "optimum per p_max", "verdict"], rows) + [""]
    rising = section.get("rising_validation") or []
    lines += ["## Instability: validation loss that rose during training", ""]
    if rising:
        lines += [f"- {r['run']}: " + "; ".join(f"step {x['from_step']} → {x['to_step']}: {x['from']:.4f} → "
                                                  f"{x['to']:.4f}" for x in r["rises"]) for r in rising]
    else:
        lines.append("None: every run's validation loss fell (or held) from each evaluation to the next.")
    return lines + [""]


def _speculative(report: dict) -> list[str]:
    if not report["speculative"]:
        return []
    lines = ["## Self-speculative decoding (Table 4 form)", "",
             "The best draft found by `speculate search` (Bayesian optimisation, genetic, hill climbing, "
             "simulated annealing); speedup, acceptance α and draft/target time measured by real greedy "
             "decoding on this CPU (timings on a shared machine: treat them as rough).", ""]
    rows = [[r["configuration"], str(len(r["runs"])), " / ".join(f"{s:.2f}×" for s in r["speedup_per_seed"]),
             f"{r['acceptance_rate_mean']:.0%}", f"{r['draft_time_ratio_mean']:.2f}",
             "; ".join(",".join(map(str, s or [])) for s in r["skip_layers"]), str(r["identical_to_greedy"])]
            for r in report["speculative"]]
    return lines + _table(["configuration", "seeds", "speedup", "α", "T_draft/T_target", "skipped layers",
                           "identical to greedy"], rows) + [""]


def _drafts(report: dict) -> list[str]:
    if not report.get("drafts"):
        return []
    lines = ["## Drafts decoded with `speculate run`", "",
             "Exit drafts (blocks 0..E-1, LayerSkip-style), skip sets, and a search's best draft (`--draft-from`; "
             "per seed, it may differ), decoded against the full model, greedily (identical to plain decoding "
             "is checked) or sampled (the rejection step keeps the full model's distribution); one value per "
             "seed (timings on a shared machine: treat them as rough).", ""]
    rows = [[r["configuration"], r["evaluation"], r["draft"],
             r.get("mode", "greedy") + (f" T={r['temperature']:g}" if r.get("mode") == "sample" else ""),
             str(r["seeds"]), " / ".join(f"{s:.2f}×" for s in r["speedup_per_seed"]),
             f"{r['acceptance_rate_mean']:.0%}", "n/a" if r["identical_to_greedy"] is None else
             str(r["identical_to_greedy"])] for r in report["drafts"]]
    return lines + _table(["configuration", "evaluation", "draft", "decoding", "seeds", "speedup", "α",
                           "identical to greedy"], rows) + [""]


def _downstream(report: dict) -> list[str]:
    section = report.get("downstream")
    if not section:
        return []
    tasks = list(section["tasks"])
    lines = ["## Downstream benchmarks (Table A.3 form)", "",
             "`eval downstream` on each run (lm-eval's tasks over the packaged data, eval/downstream/): each task's "
             "summary metric, mean ± std over seeds (documents scored; lm-eval's standard error of one run in the "
             "header row's line below). **Read against chance**: a model of a few million parameters answers these "
             "questions barely above a uniform guess, so differences between configurations here are noise unless "
             "they exceed several standard errors; the block is there for larger runs.", ""]
    rows = [["chance", *(_f(section["tasks"][t]["chance"], 3) for t in tasks)]]
    for row in section["rows"]:
        cells = []
        for task in tasks:
            cell = row["tasks"].get(task)
            cells.append("–" if cell is None else f"{cell['mean']:.3f}"
                         + (f" ± {cell['std']:.3f}" if cell["std"] is not None else "") + f" ({cell['seeds']})")
        rows.append([row["configuration"], *cells])
    header = [f"{t} ({section['tasks'][t]['metric'].split(',')[0]})" for t in tasks]
    lines += _table(["configuration", *header], rows)
    errors = {t: [r["tasks"][t]["stderr"] for r in section["rows"] if t in r["tasks"] and r["tasks"][t]["stderr"]]
              for t in tasks}
    documents = {t: [r["tasks"][t]["documents"] for r in section["rows"] if t in r["tasks"]
                     and r["tasks"][t]["documents"]] for t in tasks}
    lines += ["", "Standard error of one run (lm-eval) and documents scored: " + "; ".join(
        f"{t} ±{max(errors[t]):.3f}" + (f", {min(documents[t])} documents" if documents[t] else "")
        for t in tasks if errors[t]) + "."]
    return lines + [""]


def _runs(report: dict) -> list[str]:
    rows = [[r["run"], r["configuration"], str(r["seed"]), _f(r["val_loss"]), _f(r["end_of_training_val_loss"]),
             _f(r["mean_dropout_achieved"], 3), _flops(r["training_flops"]),
             "missing" if r.get("total_training_flops") is None else
             _flops(r["total_training_flops"]) + ("†" if r.get("total_from") == "recipe" else ""),
             f"{r['cpu_seconds']:.0f}"] for r in report["runs"]]
    return ["## Every run", ""] + _table(["run", "configuration", "seed", "held-out loss", "end-of-training val",
                                          "P̄ achieved", "non-embedding FLOPs", "total FLOPs", "CPU s"], rows) + [""]


def markdown(report: dict, *, title: str) -> str:
    lines = [f"# {title}", "",
             "Written by `layerdrop report` from a `layerdrop sweep` folder; every number is in report.json "
             "beside this file, and runs/ holds each run's config, summary and evaluations, from which "
             "`layerdrop report` rebuilds this page.", ""]
    for part in (_how_it_was_run, _findings, _own_optimum, _budgets, _projection, _choosing, _configurations, _noise,
                 _hyperparameters, _images, _speculative, _drafts, _downstream, _runs):
        lines += part(report)
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["markdown"]
