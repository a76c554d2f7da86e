"""Write the files generated from the train_* declaration (trainer/options.py):

- roles/trainer_run/meta/argument_specs.yml (what ansible-doc and the role's entry points show),
- roles/trainer_run/defaults/main.yml (every option's default),
- inventory/sample/group_vars/all/train.yml (every option commented out, with its help),
- ddpfleet_agent/options.py (the run agent's flags that are train_* options: the agent, shipped
  alone into a user's image, cannot import trainer/, so it reads this table of the declaration).

``python tools/gen_options.py`` rewrites them (``make generate``); ``--check`` changes nothing
and exits 1 naming the stale ones (``make lint``).
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.options import (  # noqa: E402
    DUMP_HELP,
    OPTIONS,
    RUN_ID_HELP,
    Option,
    agent_options,
    bounds,
)

SPECS = Path("roles/trainer_run/meta/argument_specs.yml")
DEFAULTS = Path("roles/trainer_run/defaults/main.yml")
SAMPLE = Path("inventory/sample/group_vars/all/train.yml")
AGENT = Path("ddpfleet_agent/options.py")
GENERATED = (
    "Generated from trainer/options.py by tools/gen_options.py (make generate): do not edit. "
)
ENTRY_POINTS = {
    "main": "Validate, preflight, launch (or attach to), follow and report one training run "
    "(train.yml)",
    "status": "Show each host's container and agent exit, the run's progress and summary; report a "
    "run that ended while nobody followed it (status.yml)",
    "stop": "Ask the run's agents to stop it: checkpoint, summary status stopped (stop.yml)",
}
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def scalar(value: object) -> str:
    """A value as YAML: strings bare where YAML reads them back as the same string."""
    if isinstance(value, str):
        bare = re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", value) and value.lower() not in _YAML_WORDS
        return value if bare else json.dumps(value)
    if isinstance(value, (bool, dict, list)):
        return json.dumps(value)
    return repr(value)


def rule(title: str) -> str:
    return f"# --- {title} ".ljust(96, "-")


def _comment(text: str) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text, 94)]


def _by_section() -> dict[str, list[Option]]:
    sections: dict[str, list[Option]] = {}
    for opt in OPTIONS.values():
        sections.setdefault(opt.section, []).append(opt)
    return sections


def _spec(name: str, text: str, lines: list[str]) -> list[str]:
    wrapped = ["          " + w for w in textwrap.wrap(text, 110)]
    return [f"      {name}:", "        description: >-", *wrapped, *lines]


def argument_specs() -> str:
    run_id = _spec("run_id", RUN_ID_HELP, ["        type: str", "        required: false"])
    out = [
        "---",
        *_comment(
            GENERATED + "run_id is not `required` here: tasks/validate.yml, which every playbook "
            "runs first, says what is wrong in one line (so do the train_* checks, with each "
            "option's range)."
        ),
        "argument_specs:",
    ]
    for entry, short in ENTRY_POINTS.items():
        out += [f"  {entry}:", "    short_description: >-"]
        out += ["      " + w for w in textwrap.wrap(short, 110)]
        out += ["    options:", *run_id]
        if entry in ("status", "stop"):
            out += _spec("dump", DUMP_HELP, ["        type: bool", "        default: false"])
        for opt in OPTIONS.values() if entry == "main" else ():
            lines = [f"        type: {opt.type}"]
            if opt.type == "list":
                lines.append("        elements: str")
            if opt.choices:
                lines.append(f"        choices: [{', '.join(scalar(c) for c in opt.choices)}]")
            lines.append(f"        default: {scalar(opt.default)}")
            text = f"{opt.help} From {bounds(opt)[5:]}." if opt.min is not None else opt.help
            out += _spec(opt.name, text, lines)
    return "\n".join(out) + "\n"


def defaults() -> str:
    out = [
        "---",
        *_comment(
            GENERATED + "Every train_* option of train.yml/status.yml/stop.yml with its default. "
            "Any option can be given as an extra var (-e train_max_steps=100) or in group_vars; a "
            "train_* name not declared is refused before anything starts, and so is a value "
            "outside its type, choices or range. (no-role-prefix: the train_* names are what "
            "users type; they are this role's public API.)"
        ),
    ]
    for title, opts in _by_section().items():
        out += ["", rule(title)]
        out += [f"{o.name}: {scalar(o.default)}  # noqa: var-naming[no-role-prefix]" for o in opts]
    return "\n".join(out) + "\n"


def sample() -> str:
    out = [
        "---",
        *_comment(
            "Training runs (train.yml, status.yml, stop.yml; role trainer_run). Every setting is "
            "optional: the values shown are the defaults. Uncomment to change one here, or pass it "
            "for one run as an extra var: ansible-playbook train.yml -e run_id=r1 -e "
            "train_max_steps=100. A train_* name that is not listed here is refused before "
            "anything starts (a typo must not silently do nothing), and so is a value outside its "
            "type, choices or range (roles/trainer_run/meta/argument_specs.yml gives each range). "
            "Generated from trainer/options.py: copy it, do not edit it here."
        ),
    ]
    for title, opts in _by_section().items():
        out += ["", rule(title)]
        previous = ""
        for opt in opts:
            if opt.help != previous:
                out += _comment(opt.help)
            out.append(f"# {opt.name}: {scalar(opt.default)}")
            previous = opt.help
    return "\n".join(out) + "\n"


def agent() -> str:
    rows = []
    for opt in agent_options():
        low = opt.min if opt.agent_min is None else opt.agent_min
        number = {"int": int, "float": float}.get(opt.type)
        limits = (number(low), number(opt.max)) if number else (None, None)  # type: ignore[arg-type]
        row = (opt.agent_flag, opt.type, opt.default, *limits, opt.name, opt.help)
        rows.append(f"    ({', '.join(map(repr, row))}),")
    head = [
        "# ruff: noqa: E501",
        f'"""{GENERATED.strip()}',
        "",
        "The run agent's flags that are train_* options, with the declaration's type, default,",
        "range (the agent's own floor where it has one) and help; ddpfleet_agent.cli builds its",
        "parser from them. Generated, not imported: the agent imports no trainer (train.yml ships",
        'it alone into a user\'s image)."""',
        "",
        "# (flag, type, default, min, max, train_* option, help)",
        "# fmt: off",
        "FLAGS: tuple[tuple, ...] = (",
    ]
    return "\n".join([*head, *rows, ")", "# fmt: on", ""])


FILES = {SPECS: argument_specs, DEFAULTS: defaults, SAMPLE: sample, AGENT: agent}


def stale(root: Path = ROOT) -> list[Path]:
    """The generated files whose text is not what the declaration gives."""
    return [p for p, render in FILES.items() if (root / p).read_text() != render()]


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: gen_options.py [--check]", file=sys.stderr)
        return 2
    if argv == ["--check"]:
        old = stale()
        if old:
            names = ", ".join(map(str, old))
            print(f"gen_options: stale: {names} (run make generate)", file=sys.stderr)
        return 1 if old else 0
    for path, render in FILES.items():
        (ROOT / path).write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
