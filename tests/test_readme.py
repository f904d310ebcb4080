"""The README's commands, and then those of the docs pages (DOC_PAGES, in that order), pasted in order
into a fresh clone, work.

A bash block preceded by `<!-- readme-test: run -->` is run; `<!-- readme-test: run, tiny: K=V ... -->`
adds each override to every `python train.py` line of the block that does not set that key itself,
and hands them to `make train` as TRAIN_ARGS. The clone's `.venv` is this interpreter's environment
(a link), so `make train` skips its install (`make -o install`) and nothing is downloaded; the clone's
own `src/` is imported (PYTHONPATH). The parsing is checked on every run; the clone run is `slow`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(
    r"<!-- readme-test: run(?:, tiny: (?P<tiny>[^>]*?))? -->\n```bash\n(?P<body>.*?)\n```", re.S
)


SLURM_MARKER = re.compile(r"<!-- readme-test: slurm -->\n```bash\n(?P<body>.*?)\n```", re.S)
"""The README's Slurm example: run on a real Slurm by its own test (the clone run above leaves it out)."""


DOC_PAGES = (
    "setup",
    "data",
    "training",
    "statistics",
    "policies",
    "checkpoints",
    "cluster",
    "configuration",
    "layout",
)
"""docs/<page>.md, in the order their blocks run after the README's (data before training: its
inspect-data block; checkpoints after the demo and the training runs it evaluates)."""
README_LINES = 200  # a first read: what it is, the commands, links; the rest lives in docs/


def documented_text(root: Path) -> str:
    """The README, then every docs page, as one text whose marked blocks run in order."""
    pages = [root / "README.md", *(root / "docs" / f"{page}.md" for page in DOC_PAGES)]
    return "\n".join(page.read_text() for page in pages)


@dataclass
class Block:
    commands: list[str]
    tiny: list[str]


def readme_blocks(text: str) -> list[Block]:
    """The marked bash blocks, in README order."""
    return [
        Block(match["body"].splitlines(), shlex.split(match["tiny"] or "")) for match in MARKER.finditer(text)
    ]


def _keys(words: list[str]) -> set[str]:
    return {word.split("=", 1)[0] for word in words if "=" in word}


def tiny_command(command: str, tiny: list[str]) -> str:
    """The command as the test runs it: tiny overrides added where the line does not set the key."""
    code, _, comment = command.partition(" # ")
    words = shlex.split(code)
    if words[:2] == ["python", "train.py"]:
        extra = [override for override in tiny if override.split("=", 1)[0] not in _keys(words)]
        return shlex.join([*words, *extra])
    if words[:2] == ["make", "train"]:
        return shlex.join(["make", "-o", "install", "train", f"TRAIN_ARGS={' '.join(tiny)}", *words[2:]])
    return code.strip()


def test_the_readme_marks_its_runnable_blocks():
    blocks = readme_blocks(documented_text(REPO))
    commands = [line for block in blocks for line in block.commands]
    assert [c.split(" #")[0].strip() for c in commands[:2]] == ["make train", "source .venv/bin/activate"]
    assert any(c.startswith("pretrain inspect-data") for c in commands)
    assert any(c.startswith("pretrain eval outputs/demo/latest/") for c in commands)
    assert not any("pip install" in c or "experiment=corrected" in c for c in commands)  # never downloads


def test_the_readme_fits_a_first_read_and_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES
    for page in (*DOC_PAGES, "config"):
        assert f"](docs/{page}.md)" in readme, page
    first = [line.split(" #")[0].strip() for block in readme_blocks(readme) for line in block.commands]
    assert first[:2] == ["make train", "source .venv/bin/activate"]
    assert "python train.py data=bestfit attn=varlen" in readme  # the headline command on a GPU
    assert "make sweep" in readme and "make test" in readme and "pretrain compare" in readme


def test_the_docs_links_point_at_files_that_exist():
    for page in [REPO / "README.md", *(REPO / "docs" / f"{name}.md" for name in DOC_PAGES)]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), (page.name, target)


def test_every_python_train_line_of_the_docs_says_its_cost():
    """Every example says its cost on 2 cores: each runnable python train.py / make line has a comment."""
    for block in readme_blocks(documented_text(REPO)):
        for command in block.commands:
            if command.startswith(("python train.py", "make ")):
                assert " # " in command, command


def test_tiny_overrides_fill_only_the_keys_a_line_leaves_open():
    tiny = ["train.max_steps=4", "data.max_seq_len=64"]
    assert tiny_command("python train.py data=padded data.max_seq_len=256   # a comment", tiny) == (
        "python train.py data=padded data.max_seq_len=256 train.max_steps=4"
    )
    assert tiny_command("make train   # the demo", tiny) == (
        "make -o install train 'TRAIN_ARGS=train.max_steps=4 data.max_seq_len=64'"
    )
    assert tiny_command("pretrain verify   # in place", tiny) == "pretrain verify"


@pytest.mark.slow
def test_every_marked_readme_command_works_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(Path(sys.prefix))  # this environment: nothing is installed
    script = ["set -euo pipefail"]
    for block in readme_blocks(documented_text(clone)):
        for command in block.commands:
            line = tiny_command(command, block.tiny)
            script += [f"echo {shlex.quote('$ ' + line)}", line]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PRETRAIN_CACHE_ROOT", "PYTHONPATH", "VIRTUAL_ENV")  # the clone builds its own cache
    }
    env |= {
        "PYTHONPATH": str(clone / "src"),
        "PATH": f"/usr/bin:/bin:{env.get('PATH', '')}",  # no venv on PATH until the README activates it
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    (tmp_path / "wandb").mkdir()
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=clone, env=env, capture_output=True, text=True, timeout=3000
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    demo = clone / "outputs" / "demo" / "latest"
    for name in ("compare.png", "compare.md", "padded/metrics.csv", "bestfit/checkpoints/last.ckpt"):
        assert (demo / name).exists(), name
    assert "comparison: outputs/demo/" in proc.stdout
    assert (clone / "concat.json").is_file() and (clone / "eval.json").is_file()
    assert (clone / "my-gpt2" / "model.safetensors").is_file() and (clone / "mine.png").is_file()


def test_the_readme_slurm_block_runs_on_a_real_slurm(slurm_cluster, tmp_path):
    """The README's cluster example, pasted into a fresh clone with its environment activated, on the
    Slurm that scripts/slurm_local.sh started (PRETRAIN_REQUIRE_SLURM=1 in CI: it cannot be skipped)."""
    (match,) = SLURM_MARKER.finditer((REPO / "README.md").read_text())
    commands = [line.split(" # ")[0].strip() for line in match["body"].splitlines()]
    assert commands[0] == "scripts/slurm_local.sh start"
    assert any(c.startswith("sbatch --wait") and "scripts/slurm/train.sbatch" in c for c in commands)
    assert any(c.startswith("python train.py --multirun hydra/launcher=slurm") for c in commands)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(Path(sys.prefix))
    script = ["set -euo pipefail", "source .venv/bin/activate"]
    for command in commands:
        script += [f"echo {shlex.quote('$ ' + command)}", command]
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env = {key: value for key, value in env.items() if key not in ("PRETRAIN_CACHE_ROOT", "VIRTUAL_ENV")}
    env |= {"PYTHONPATH": str(clone / "src"), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    env |= {"HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=clone, env=env, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (job,) = re.findall(r"Submitted batch job (\d+)", proc.stdout)
    run = clone / "outputs" / f"slurm-{job}"
    report = json.loads((run / "run.json").read_text())
    assert report["status"] == "completed" and report["steps"] == 12  # experiment=smoke's
    log = (clone / f"slurm-{job}.out").read_text()
    assert "1 node(s) x 2 task(s)" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    table = (clone / "slurm.md").read_text()  # compare prints one screen; the tables go to the file
    for arm in ("padded", "bestfit"):
        assert f"| {arm} |" in table
    assert "wrote in .: slurm.png slurm-contrast.png slurm.md slurm.json" in proc.stdout
    assert (clone / "slurm.png").is_file()


PACKING_FIGURES = re.compile(
    r"At capacity (?P<capacity>\d+), K=(?P<bins>\d+) fills (?P<firstfit>[\d.]+) % of its slots on "
    r"FineWeb-like lengths \(best fit from (?P<buffer>\d+) chunks: (?P<bestfit>[\d.]+) %, "
    r"BFD (?P<bfd>[\d.]+) %"
)


def test_the_docs_packing_figures_are_the_packing_benchmarks():
    """The fill figures the docs quote (docs/data.md: first fit, best fit, BFD on the FineWeb-like
    lengths) are bench/results/packing.json's, rounded as quoted: `make bench` is their source."""
    import json

    text = " ".join((REPO / "docs" / "data.md").read_text().split())
    match = PACKING_FIGURES.search(text)
    assert match, "docs/data.md's first-fit/best-fit/BFD fill sentence"
    result = json.loads((REPO / "bench" / "results" / "packing.json").read_text())
    assert int(match["capacity"]) == result["settings"]["capacity"]
    measured = result["datasets"]["synth"]["utilization"]  # lognormal(6, 1): the FineWeb-like lengths
    for quoted, key in (
        ("firstfit", f"firstfit_{match['bins']}"),
        ("bestfit", f"bestfit_{match['buffer']}"),
        ("bfd", "bfd"),
    ):
        decimals = len(match[quoted].partition(".")[2])
        assert match[quoted] == f"{100 * measured[key]:.{decimals}f}", key
    methods = {row["method"] for row in result["rows"] if row["data"] == "synth"}
    assert {f"firstfit k={match['bins']}", f"bestfit b={match['buffer']}", "bfd (offline)"} <= methods
