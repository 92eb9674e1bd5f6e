"""`layerdrop report SWEEP_DIR`: the paper's tables and plots from a sweep, with verdicts.

    layerdrop report sweeps/paper-cpu --out docs/reproduction

writes into ``--out``:

    README.md        the report: how it was run, the findings with a verdict each, the
                     Table 2/3 form, the noise, the plots, the Table 4 form, every run
    report.json      every number in README.md and the plots, and how it was computed
    images/*.png     pareto, exits, skip, degradation, heatmaps
    runs/<run>/      the small files of every run (config, summary, status, evals, curve):
                     `layerdrop report <out>` rebuilds the same report from them alone

``--out`` is new, empty, or a report (replaced only with ``--overwrite``); any other
folder is refused (eval/experiments/report/out_folder.py).

``--project TPP`` writes no report but projection.md and projection.json: every gap of this
report and its ``--across`` ones projected to TPP tokens per parameter, with the rule that will
judge that budget; ``--projection FILE`` gives a report of that budget the registered file, whose
rule it applies (eval/experiments/report/projection.py).

Runs are labelled by configuration (eval/experiments/sweep/results.py), numbers come from
eval/experiments/report/tables.py, verdicts from eval/experiments/report/findings/.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from pathlib import Path

import yaml

from eval.experiments.report.budget_trend import trend, write_trend_figure
from eval.experiments.report.choosing import choosing
from eval.experiments.report.findings import all_findings, holm_adjust
from eval.experiments.report.hyperparameter_curves import curves_figure, hyperparameter_report
from eval.experiments.report.projection import judge, judged_markdown, project, projection_markdown
from eval.experiments.report.out_folder import PROJECTION_FILE, check_out, clear_report
from eval.experiments.report.own_optimum import comparisons, own_optimum
from eval.experiments.report.significance import pooled_std
from eval.experiments.report.markdown import markdown
from eval.experiments.report.tables import (configuration_table, correlation, downstream_table, draft_table,
                                            elasticity_points, group, speculative_table, val_loss)
from eval.experiments.sweep.results import RunResult, copy_results, flop_conventions, load_results, with_aliases
from eval.measurements import plots
from framework.command_parser import CommandParser
from framework.config import LayerDropoutConfig
from framework.files.atomic_write import write_text
from framework.schedules import dropout_rates

PROG = "layerdrop report"
HEATMAP_COLUMNS = 100


def exit_curves(configurations) -> list[dict]:
    """Mean exit loss over a configuration's seeds, at the exits every seed has."""
    curves = []
    for configuration in configurations:
        per_run = [r.exit_loss for r in configuration.runs if r.exit_loss]
        if not per_run:
            continue
        common = sorted(set.intersection(*(set(e) for e in per_run)))
        curves.append({"label": configuration.label, "seeds": len(per_run),
                       "exit_loss": {str(k): statistics.fmean(e[k] for e in per_run) for k in common}})
    return curves


def skip_curves(configurations) -> list[dict]:
    """Mean loss of each skip set over a configuration's seeds."""
    curves = []
    for configuration in configurations:
        reports = [r.eval_with("results") for r in configuration.runs]
        reports = [r for r in reports if r is not None]
        if not reports:
            continue
        sets: dict[tuple, list[dict]] = {}
        for report in reports:
            for row in report["results"]:
                sets.setdefault(tuple(row["skip_layers"]), []).append(row)
        results = [{**rows[0], "loss": statistics.fmean(r["loss"] for r in rows), "seeds": len(rows)}
                   for rows in sets.values()]
        curves.append({"label": configuration.label, "num_layers": reports[0].get("num_layers"),
                       "results": sorted(results, key=lambda r: r["params_kept"])})
    return curves


def heatmaps(configurations) -> list[dict]:
    """p(ℓ, t) for each distinct distribution × schedule (at its largest p_max in the sweep)."""
    chosen: dict[tuple, RunResult] = {}
    for configuration in configurations:
        run = configuration.first
        dropout = run.layer_dropout
        if run.dense:
            continue
        key = (str(dropout.get("distribution")), str(dropout.get("schedule")))
        if key not in chosen or float(dropout.get("p_max", 0)) > float(chosen[key].layer_dropout.get("p_max", 0)):
            chosen[key] = run
    maps = []
    for (distribution, schedule), run in chosen.items():
        cfg = LayerDropoutConfig(**{k: v for k, v in run.layer_dropout.items()})
        steps = int(run.config["trainer"]["max_steps"])
        columns = sorted({round(i * (steps - 1) / (HEATMAP_COLUMNS - 1)) for i in range(HEATMAP_COLUMNS)})
        per_step = [dropout_rates(cfg, run.num_layers, t, steps) for t in columns]
        maps.append({"title": f"{distribution} × {schedule} (p_max={cfg.p_max:g})", "distribution": distribution,
                     "schedule": schedule, "p_max": cfg.p_max, "steps": steps, "columns": columns,
                     "rates": [[row[layer] for row in per_step] for layer in range(run.num_layers)]})
    return maps


def model_summary(results: list[RunResult]) -> dict:
    """The model and budget of the sweep's runs (each distinct shape once, with its run count)."""
    from eval.experiments.sweep.spec import non_embedding_parameters
    from framework.config import ModelConfig

    shapes: dict[str, dict] = {}
    for run in results:
        decoder = {k: v for k, v in run.config["model"]["decoder"].items()
                   if k not in ("logit_multiplier", "residual_multiplier")}
        try:
            model = ModelConfig(**decoder)  # the resolved config's values, defaults filled in
        except (TypeError, ValueError):  # a hand-made config that is not a decoder's
            continue
        params = non_embedding_parameters(model)
        data = run.config.get("data", {})
        shape = {"d_model": model.d_model, "n_layers": model.n_layers, "n_heads": model.n_heads,
                 "vocab_size": model.vocab_size,
                 "non_embedding_params": params, "tokens": run.summary["tokens"], "steps": run.summary["steps"],
                 "batch_size": data.get("batch_size"), "seq_len": data.get("seq_len"),
                 "tokens_per_parameter": run.summary["tokens"] / params}
        key = json.dumps(shape, sort_keys=True)
        shapes.setdefault(key, {**shape, "runs": 0})["runs"] += 1
    return {"shapes": list(shapes.values())}


def data_read(results: list[RunResult]) -> dict:
    """The data the runs trained on, as their summaries record it (``data.identity``, written since
    framework/files/manifest.py's ``data_identity``): each distinct record with its runs, and the
    runs that predate the record. Two records on one page mean its comparisons mix corpora."""
    groups: dict[str, list[str]] = {}
    unrecorded = []
    for result in results:
        identity = (result.summary.get("data") or {}).get("identity")
        if identity:
            groups.setdefault(json.dumps(identity, sort_keys=True), []).append(result.name)
        else:
            unrecorded.append(result.name)
    return {"identities": [{"identity": json.loads(key), "runs": names} for key, names in groups.items()],
            "unrecorded": unrecorded}


def build_report(root: Path) -> tuple[dict, list[RunResult]]:
    results, skipped = load_results(root)
    if not results:
        raise ValueError(f"no finished run in {str(root)!r} (a finished run has summary.json): "
                         + ("; ".join(skipped) if skipped else "runs/ is empty"))
    configurations = group(results)
    table, noise = configuration_table(configurations)
    points = elasticity_points(results)
    correlations = {k: correlation(points, k) for k in ("exit_degradation", "skip_degradation")}
    machine = json.loads((root / "machine.json").read_text()) if (root / "machine.json").is_file() else {}
    sweep_file = root / "sweep.yaml" if (root / "sweep.yaml").is_file() else root / "tune.yaml"  # layerdrop tune's
    prepare = (yaml.safe_load(sweep_file.read_text()).get("data") or {}).get("prepare") if sweep_file.is_file() else None
    model = model_summary(results)
    # Loss vs η, σ, τ_EMA: a compute-matched run is another length, not another point of a curve.
    hyperparameters = hyperparameter_report([r for r in results if not r.matched_to] or results,
                                            pooled_std([c.values(val_loss) for c in configurations])[0])
    params = [s["non_embedding_params"] for s in model["shapes"]]
    findings = all_findings(configurations, results, points, hyperparameters,
                            round(statistics.median(params)) if params else None)
    own = own_optimum(configurations, table)  # each configuration at its own τ_EMA (docs/lambda-6tpp/PROTOCOL.md)
    report = {
        "sweep": str(root), "machine": machine, "skipped_runs": skipped, "model": model, "data": data_read(results),
        "prepare": [str(a) for a in prepare] if prepare else None,
        "noise": noise, "configurations": table, "findings": findings,
        "multiple_comparisons": holm_adjust(findings, table, comparisons(own)),
        "elasticity": {"points": points, "correlations": correlations},
        "speculative": speculative_table(configurations),
        "drafts": draft_table(configurations),
        "downstream": downstream_table(configurations),
        "exit_curves": exit_curves(configurations), "skip_curves": skip_curves(configurations),
        "heatmaps": heatmaps(configurations),
        "hyperparameters": hyperparameters,
        "runs": [run_row(r) for r in results],
        "curves": [{"run": r.name, "label": r.label, **{k: r.curve.get(k, []) for k in
                                                        ("step", "training_flops", "val_loss")}} for r in results],
    }
    if own is not None:
        report["own_optimum"] = own
    return report, results


def default_title(root: Path, report: dict) -> str:
    """What the sweep is, from what it holds: a tuning, a µTransfer check (η over shapes),
    Fig. 3 (η over dropout rates), or the paper's grid."""
    section = report.get("hyperparameters") or {}
    if (root / "tune.json").is_file():
        return "Tuning the base"
    if section.get("transfer"):
        return "The µTransfer check: the optimal η_base across width and depth"
    if section.get("figure3"):
        return "Fig. 3: the optimal η across dropout rates"
    return "Reproducing the paper"


def run_row(run: RunResult) -> dict:
    heldout = run.eval_with("groups")
    data = run.config.get("data", {})
    batches = min(b for b in (data.get("val_batches"), run.config.get("trainer", {}).get("limit_val_batches"))
                  if isinstance(b, int)) if isinstance(data.get("val_batches"), int) else None
    return {"run": run.name, "configuration": run.label, "seed": run.seed, "val_loss": run.val_loss,
            "heldout_tokens": heldout["tokens"] if heldout else None,
            "heldout_slices": len(heldout["groups"]["tokens"]) if heldout else None,
            "training_val_tokens": batches * data["batch_size"] * data["seq_len"] if batches else None,
            "heldout_standard_error": heldout["standard_error"][str(run.num_layers)] if heldout else None,
            "end_of_training_val_loss": run.summary.get("val_loss"),
            "mean_dropout_predicted": run.summary["mean_dropout_predicted"],
            "mean_dropout_achieved": run.summary["flops_saved_pct"] / 100,
            "training_flops": run.summary["training_flops"], **flop_conventions(run), "tokens": run.summary["tokens"],
            "steps": run.summary["steps"], "cpu_seconds": run.cpu_seconds,
            "stages": {k: round(v.get("cpu_seconds", 0.0), 1) for k, v in run.status.get("stages", {}).items()}}


def write_images(report: dict, out: Path) -> dict[str, str]:
    images = out / "images"
    colour_of = plots.colours([c["configuration"] for c in report["configurations"]])
    written = {"pareto": plots.save(plots.pareto_figure, images / "pareto.png", report["curves"], colour_of)}
    if report["exit_curves"]:
        written["exits"] = plots.save(plots.exits_figure, images / "exits.png", report["exit_curves"],
                                      title="Early exit (mean over seeds)", colour_of=colour_of)
    if report["skip_curves"]:
        written["skip"] = plots.save(plots.skip_figure, images / "skip.png", report["skip_curves"],
                                     colour_of=colour_of)
    if any(p["exit_degradation"] is not None for p in report["elasticity"]["points"]):
        written["degradation"] = plots.save(plots.degradation_figure, images / "degradation.png",
                                            report["elasticity"]["points"], colour_of,
                                            report["elasticity"]["correlations"])
    if report["heatmaps"]:
        written["heatmaps"] = plots.save(plots.heatmap_figure, images / "heatmaps.png", report["heatmaps"])
    for key, found in report["hyperparameters"]["curves"].items():
        name = f"loss_vs_{key.split('.')[-1]}"
        written[name] = plots.save(curves_figure, images / f"{name}.png", found, key)
    if report.get("budgets") and write_trend_figure(report["budgets"], images / "budgets.png"):
        written["budgets"] = images / "budgets.png"
    return {name: str(path.relative_to(out)) for name, path in written.items()}


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description="The paper's tables, plots and verdicts from a "
                                     "sweep folder: Markdown + PNG + the JSON behind every number.")
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a folder made by `layerdrop sweep` (or by this "
                        "command's --out: it holds a copy of the runs' small files)")
    parser.add_argument("--out", default=None, metavar="DIR", help="where README.md, report.json, images/ and "
                        "runs/ go (default: SWEEP_DIR/report)")
    parser.add_argument("--overwrite", action="store_true", help="replace the report already in --out (a folder "
                        "that holds something else is never written into)")
    parser.add_argument("--title", default=None, help="the report's heading (default: \"Tuning the base\" for a "
                        "`layerdrop tune` folder, else \"Reproducing the paper\")")
    parser.add_argument("--path-alias", action="append", default=[], metavar="PATH=ALIAS",
                        help="write ALIAS for PATH in everything the report writes (repeatable), e.g. "
                             "/scratch/me/sweeps/paper-cpu=sweeps/paper-cpu, to commit a report without "
                             "machine-specific paths")
    parser.add_argument("--across", action="append", default=[], metavar="REPORT_DIR",
                        help="a report of the same grid at another budget (its report.json; repeatable): adds "
                             "the paper's Fig. 8 view, each finding's gap at every tokens-per-parameter budget "
                             "and whether it moved beyond the noise")
    parser.add_argument("--project", type=float, default=None, metavar="TPP",
                        help="write no report: project every gap found at the two largest budgets (this one and "
                             "the --across ones) to TPP tokens per parameter, with the rule registered to judge it "
                             "(projection.md and projection.json in --out)")
    parser.add_argument("--projection", default=None, metavar="FILE",
                        help="the projection.json registered before this budget's runs: the report sets its "
                             "numbers beside the projection and applies the registered rule")
    return parser


def read_projection(path: str | None) -> dict | None:
    """A registered projection.json, checked before any work."""
    if path is None:
        return None
    try:
        found = json.loads(Path(path).read_text())
    except OSError:
        raise FileNotFoundError(f"--projection {path!r} cannot be read: expected a {PROJECTION_FILE} written by "
                                "`layerdrop report --project`") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--projection {path!r} is not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(found, dict) or not isinstance(found.get("rule"), dict) or not isinstance(found.get("rows"), list):
        raise ValueError(f"--projection {path!r} holds no projection (no rule and rows): expected a file written by "
                         "`layerdrop report --project`")
    return found


def write_projection(args: argparse.Namespace, argv: list[str] | None, out: Path) -> int:
    """``--project``: the projection of this report and its --across ones, and no report."""
    try:
        across = read_across(args.across)
        report, _ = build_report(Path(args.sweep_dir))
        projection = project([(args.sweep_dir, report), *across], args.project)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    projection["projection_command"] = shlex.join(["layerdrop", "report", *(sys.argv[1:] if argv is None else argv)])
    if (out / PROJECTION_FILE).is_file():  # --overwrite: the earlier versions stay on record, in the new file
        earlier = json.loads((out / PROJECTION_FILE).read_text())
        projection["earlier"] = [{k: v for k, v in earlier.items() if k != "earlier"}, *earlier.get("earlier", [])]
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / PROJECTION_FILE, json.dumps(projection, indent=1) + "\n")
    write_text(out / "projection.md", projection_markdown(projection, command=projection["projection_command"]))
    print(f"{len(projection['rows'])} gaps projected to {args.project:g} TPP; wrote {out / 'projection.md'} and "
          f"{out / PROJECTION_FILE}")
    return 0


def read_across(folders: list[str]) -> list[tuple[str, dict]]:
    """The report.json of each ``--across`` folder, checked before any work."""
    reports = []
    for folder in folders:
        path = Path(folder) / "report.json"
        if not path.is_file():
            raise FileNotFoundError(f"--across {folder!r} holds no report.json: expected a folder written by "
                                    "`layerdrop report`")
        try:
            found = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"--across {folder!r}: report.json is not JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(found, dict) or not isinstance(found.get("findings"), list):
            raise ValueError(f"--across {folder!r}: report.json holds no findings: expected a `layerdrop report` "
                             "of a sweep")
        reports.append((folder, found))
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    root = Path(args.sweep_dir)
    out = Path(args.out) if args.out else root / "report"
    aliases = {}
    for item in args.path_alias:
        path, _, alias = item.partition("=")
        if not path or not alias:
            parser.error(f"--path-alias {item!r} is invalid: expected PATH=ALIAS")
        aliases[path] = alias
    if args.project is not None and not (math.isfinite(args.project) and args.project > 0):
        parser.error(f"--project {args.project!r} is invalid: expected tokens per parameter, a number > 0")
    if args.project is not None and args.projection is not None:
        parser.error("--project and --projection exclude each other: --project writes a projection, --projection "
                     "judges a report by one")
    try:
        check_out(out, args.overwrite, projection=args.project is not None)
        if args.project is not None:
            return write_projection(args, argv, out)
        registered = read_projection(args.projection)
        across = read_across(args.across)
        report, results = build_report(root)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    if across:
        report["budgets"] = trend(report, "this report", across)
    if registered is not None:
        report["projection"] = {"file": args.projection, **judge(report, registered)}
    report["choosing"] = choosing([report, *(other for _, other in across)])
    clear_report(out, root)
    out.mkdir(parents=True, exist_ok=True)
    copy_results(results, out, root / "sweep.yaml", aliases)
    if (root / "machine.json").is_file() and (root / "machine.json").resolve() != (out / "machine.json").resolve():
        write_text(out / "machine.json", with_aliases((root / "machine.json").read_text(), aliases))
    report["images"] = write_images(report, out)
    report["report_command"] = shlex.join(["layerdrop", "report", *(sys.argv[1:] if argv is None else argv)])
    if aliases:  # the command as it reads once the paths are aliased (its --path-alias words dropped)
        words = (sys.argv[1:] if argv is None else argv)
        kept = [w for i, w in enumerate(words) if w != "--path-alias" and not (i and words[i - 1] == "--path-alias")
                and not w.startswith("--path-alias=")]
        report["report_command"] = shlex.join(["layerdrop", "report", *kept])
    write_text(out / "report.json", with_aliases(json.dumps(report, indent=1, default=str), aliases) + "\n")
    title = args.title or default_title(root, report)
    write_text(out / "README.md", with_aliases(markdown(report, title=title), aliases))
    verdicts = ", ".join(f"{f['id']}: {f['verdict']}" for f in report["findings"])
    print(f"{len(results)} runs in {len(report['configurations'])} configurations ({verdicts})")
    print(f"wrote {out / 'README.md'}, {out / 'report.json'} and {len(report['images'])} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
