"""`python run.py --help`: the config groups a user can choose from (not the `method_options` schema
group, which only conf/method files use), how method options are set, and the composed config.

Stored in Hydra's ConfigStore as `hydra/help/sparsespec`; conf/config.yaml selects it.
"""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from sparsespec.harness.entries import CONF_DIR
from sparsespec.harness.schema import GROUP as SCHEMA_GROUP

NOTES = {
    "ctx": "or any whole number of tokens, e.g. ctx=3000",
    "method": "python -m sparsespec.methods [method] lists each one's options, defaults and reasons",
}


def group_lines() -> list[str]:
    """One line per config group of conf/: its options, then a note where one helps."""
    lines = []
    for folder in sorted(p for p in CONF_DIR.iterdir() if p.is_dir() and p.name != SCHEMA_GROUP):
        options = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        note = f"  ({NOTES[folder.name]})" if folder.name in NOTES else ""
        lines.append(f"{folder.name}: {options}{note}")
    return lines


def template() -> str:
    groups = "\n".join(group_lines())
    # ${...} is resolved by OmegaConf when Hydra reads the template; $CONFIG is filled in by Hydra after
    return f"""${{hydra.help.header}}
== Config groups (group=option) ==
{groups}

== Method options ==
method.options.<name>=<value> sets one option of the chosen method, e.g.
  python run.py method=sparsespec_fixed method.options.k=12
python -m sparsespec.methods [method] lists every option with its default and the reason for it.
Options differ between methods, so a sweep cannot set one across methods that lack it
(-m method=ar,sparsespec method.options.budget=0.05); compare such settings in one run instead:
  python run.py 'bench.methods=[sparsespec,"sparsespec:budget=0.05",streaming]'

== Config ==
Override anything in the config (key=value); docs/harness.md explains each setting.

$CONFIG
${{hydra.help.footer}}"""


def register_help() -> None:
    ConfigStore.instance().store(group="hydra/help", name="sparsespec", node={
        "app_name": "run.py",
        "header": "python run.py [key=value ...]: one run of the sparsespec harness (-m: a sweep). See docs/harness.md.\n",
        "footer": "Hydra's own flags: python run.py --hydra-help\n",
        "template": template(),
    })
