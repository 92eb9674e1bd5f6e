"""The README and its guides run as written: every ```bash block of README.md and of every
page of docs/guide/ is executed on the CPU, the README's first, then each guide's in the order
of the README's guide list (a later page may use what an earlier one made), in one scratch
folder laid out like a clone (recipes/ copied, the code and .venv linked).

A block that needs what CI does not have is marked on the line directly above its fence:

    <!-- readme: not-run (gpu) -->        GPUs
    <!-- readme: not-run (cluster) -->    several nodes, SLURM
    <!-- readme: not-run (hours) -->      CPU-hours of training (a full sweep)
    <!-- readme: not-run (placeholders) -->   paths the reader supplies (their corpus, CKPT)

and is checked instead: `bash -n`, every `layerdrop` command it names answers `--help`, and
every recipe or launch script it names exists. A block runs unchanged; what would take too
long is scaled by the environment variables the README's own text uses (`${STEPS:-300}` and
the like, set small below) and by the Makefile's `STEPS` for `make demo`. `make test` is the
suite itself and is not run from inside it; `make install` finds .venv installed.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDES = REPO / "docs" / "guide"
GUIDE_LINK = re.compile(r"^\d+\. \[[^\]]+\]\((docs/guide/[\w-]+\.md)\)", flags=re.MULTILINE)
README_LINES = 400  # what the README may grow to: the manual lives in the guides
MARK = re.compile(r"^<!--\s*readme:\s*not-run\s*\(([a-z-]+)\)\s*-->$")
REASONS = ("gpu", "cluster", "hours", "placeholders")

# The README's own knobs, small: a smoke run of every command.
SCALE = {"STEPS": "4", "TOKENS": "1M", "LIMIT": "2", "BUDGET": "4", "NEW_TOKENS": "8"}

# Run before every block (not part of its text): `make test` would run this suite again.
PRELUDE = """set -eo pipefail
make() {
  if [ "$1" = test ]; then echo "readme test: 'make test' is this suite; not run from inside it"; return 0; fi
  command make -o .venv/.installed "$@"
}
"""


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    text: str
    not_run: str | None  # the marker's reason
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md, then the guides in the order its guide list gives them."""
    return [README] + [REPO / link for link in GUIDE_LINK.findall(README.read_text())]


def all_blocks() -> list[Block]:
    """Every page's blocks, in the order they run."""
    return [block for page in pages()
            for block in readme_blocks(page.read_text(), str(page.relative_to(REPO)))]


def all_text() -> str:
    return "\n".join(page.read_text() for page in pages())


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The ```bash blocks of ``text`` in order, with the not-run marker directly above each."""
    lines, blocks, index = text.splitlines(), [], 0
    while index < len(lines):
        if lines[index].strip() == "```bash":
            end = index + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            above = MARK.match(lines[index - 1].strip()) if index else None
            blocks.append(Block(index + 1, "\n".join(lines[index + 1:end]) + "\n", above.group(1) if above else None,
                                page))
            index = end
        index += 1
    return blocks


def commands(block: str) -> list[list[str]]:
    """The `layerdrop` command lines of a block (continuations joined), as words."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        line = line.split(" #")[0].strip()
        words = line.split()
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value before the command
            words = words[1:]
        if words and words[0] == "layerdrop":
            found.append(words)
    return found


def test_blocks_are_found_with_their_markers():
    text = "intro\n```bash\nls\n```\n<!-- readme: not-run (gpu) -->\n```bash\nnvidia-smi\n```\n```\nnot bash\n```\n"
    assert readme_blocks(text) == [Block(2, "ls\n", None), Block(6, "nvidia-smi\n", "gpu")]


def test_commands_joins_continuations_and_drops_comments():
    block = "CKPT=x\nlayerdrop eval exits --ckpt $CKPT \\\n    --out r.json   # a comment\nNODE=1 layerdrop pretrain\n"
    assert commands(block) == [["layerdrop", "eval", "exits", "--ckpt", "$CKPT", "--out", "r.json"],
                               ["layerdrop", "pretrain"]]


def test_every_marker_names_a_known_reason_and_sits_on_a_fence():
    for page in pages():
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if "readme:" in line and line.strip().startswith("<!--"):
                where = f"{page.relative_to(REPO)}:{number + 1}"
                match = MARK.match(line.strip())
                assert match and match.group(1) in REASONS, f"{where}: {line!r} (reasons: {REASONS})"
                assert lines[number + 1].strip() == "```bash", f"{where}: the marker must sit on a fence"


def test_the_readme_is_short_and_lists_every_guide():
    """The manual is in docs/guide/: a page missing from the README's list would never run."""
    assert len(README.read_text().splitlines()) <= README_LINES
    listed = [page.name for page in pages()[1:]]
    assert listed and sorted(listed) == sorted(path.name for path in GUIDES.glob("*.md"))
    assert len(set(listed)) == len(listed)


def test_every_relative_link_of_every_page_resolves():
    """Moving the manual into docs/guide/ moved every relative link's base."""
    link = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")
    for page in pages():
        for target in link.findall(page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)}: link {target!r} resolves to nothing"


def scratch_clone(root: Path) -> Path:
    """A folder laid out like a clone: what blocks only read is linked, what they may
    write (recipes/1.8b.yaml with --overwrite) is copied; data/ and runs/ start empty, as in
    a fresh clone (the blocks prepare what they read: 3M and 1M tokens take seconds)."""
    for name in (".venv", "framework", "eval", "data_prep", "benchmarks", "docs", "Makefile", "pyproject.toml",
                 "constraints-cpu.txt"):
        if (REPO / name).exists():
            (root / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "recipes", root / "recipes")
    return root


def environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "COV_"))}
    env.update(SCALE, PATH=f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    return env


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", PRELUDE + block.text], cwd=cwd, env=environment(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)


def failure(block: Block, done: subprocess.CompletedProcess) -> str:
    return (f"{block.where}: the block exits {done.returncode}\n{block.text}\n--- last output ---\n"
            + "\n".join(done.stdout.splitlines()[-40:]))


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's finished children (the blocks' commands)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@pytest.mark.slow
@pytest.mark.timeout(2400)  # every block in turn: over `make test`'s 600 s per test on a loaded machine
def test_readme_runs_as_written(tmp_path):
    root = scratch_clone(tmp_path)
    wall, cpu = time.monotonic(), children_cpu_seconds()
    for block in all_blocks():
        if block.not_run is None:
            started, used = time.monotonic(), children_cpu_seconds()
            done = run_block(block, root)
            # shown with -s; CPU time is the figure to compare (wall time follows the machine's load)
            print(f"{block.where}: {children_cpu_seconds() - used:.0f} CPU s, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
            assert done.returncode == 0, failure(block, done)
    print(f"README and guides: all blocks {children_cpu_seconds() - cpu:.0f} CPU s, {time.monotonic() - wall:.0f} s",
          flush=True)


@pytest.mark.slow
def test_not_run_blocks_are_commands_that_exist(tmp_path):
    root = scratch_clone(tmp_path)
    layerdrop = REPO / ".venv" / "bin" / "layerdrop"
    asked: set[tuple[str, ...]] = set()
    for block in all_blocks():
        if block.not_run is None:
            continue
        syntax = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True)
        assert syntax.returncode == 0, f"{block.where}: {syntax.stderr}"
        for words in commands(block.text):
            command = tuple(w for w in words[1:3] if not w.startswith("-") and "/" not in w and "." not in w)
            if command not in asked:
                asked.add(command)
                done = subprocess.run([str(layerdrop), *command, "--help"], cwd=root, env=environment(),
                                      capture_output=True, text=True, timeout=300)
                assert done.returncode == 0, f"{block.where}: layerdrop {' '.join(command)} --help: " \
                                             f"{done.stderr.strip()[-500:]}"
        for path in re.findall(r"\brecipes/[\w./-]+", block.text):
            assert (root / path).exists(), f"{block.where}: {path} does not exist"


def test_the_command_list_names_every_command():
    """The README's list of `layerdrop --help`'s commands once left out `tune`."""
    from framework.cli import COMMANDS

    text = README.read_text()
    listing = text[text.index("`layerdrop --help` lists the commands"):]
    listing = listing[:listing.index(";\n")]
    for name in {name.split()[0] for name in COMMANDS}:
        assert f"`{name}" in listing, f"the README's command list does not name {name!r}"


def test_the_strategy_table_names_every_strategy_and_auto():
    from framework.strategies import STRATEGIES

    rows = set(re.findall(r"^\| `([\w-]+)` \|", all_text(), flags=re.MULTILINE))
    assert {"auto", *STRATEGIES} <= rows


def test_the_progress_interval_the_readme_gives_is_pretrains_default():
    """The README said a line every 10 s where `pretrain`'s default is 30 s."""
    import inspect

    from framework.training import pretrain

    default = re.search(r'"--progress_every", type=float \| None, default=([\d.]+)',
                        inspect.getsource(pretrain.PretrainCLI.add_arguments_to_parser))
    seconds = f"{float(default.group(1)):g}"
    assert f"`layerdrop pretrain`: every {seconds} s by default" in all_text()


def test_every_knob_of_a_run_block_is_set_small_by_this_test():
    """A `${NAME:-default}` the README defines but SCALE does not set runs at full size."""
    knobs = {name for block in all_blocks() if block.not_run is None
             for name in re.findall(r"\$\{(\w+):-", block.text)}
    assert knobs <= set(SCALE), f"not scaled by the test: {sorted(knobs - set(SCALE))}"


def test_the_timed_decoding_commands_scale_their_length():
    """`speculate search` / `run` decode 64 tokens a prompt in timed repeats: a third of this
    test's time until NEW_TOKENS scaled them."""
    found = [words for block in all_blocks() if block.not_run is None
             for words in commands(block.text) if words[1] == "speculate"]
    assert found and all("${NEW_TOKENS:-64}" in words for words in found)
