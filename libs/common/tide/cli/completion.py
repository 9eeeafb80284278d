"""`tide completion bash|zsh`: a static completion script generated from the argparse parser."""

from __future__ import annotations

import argparse


def commands(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each subcommand and its options (and, for one with a fixed choice of positionals, those choices)."""
    out: dict[str, list[str]] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse offers no public way to walk subparsers
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                words: list[str] = []
                for a in sub._actions:  # noqa: SLF001
                    words += [o for o in a.option_strings if o.startswith("--")] or list(a.option_strings)
                    if not a.option_strings and a.choices and not isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
                        words += [str(c) for c in a.choices]
                    if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
                        words += list(a.choices)
                out[name] = sorted(set(words) - {"-h"})
    return out


def global_options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})  # noqa: SLF001


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    cmds = commands(parser)
    cases = "\n".join(f'        {name}) words="{" ".join(opts)}" ;;' for name, opts in sorted(cmds.items()))
    bash = f"""# tide completion ({shell}); load with: eval "$(tide completion {shell})"
_tide() {{
    local cur cmd words i w
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    cmd=""
    i=1
    while [ "$i" -lt "$COMP_CWORD" ]; do
        w="${{COMP_WORDS[$i]}}"
        case "$w" in
            --home) i=$((i + 1)) ;;
            -*) ;;
            *) cmd="$w"; break ;;
        esac
        i=$((i + 1))
    done
    case "$cmd" in
        "") words="{" ".join(sorted(cmds))} {" ".join(global_options(parser))}" ;;
{cases}
        *) words="" ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    if [ -n "$cmd" ] && [ "${{cur#-}}" = "$cur" ]; then
        COMPREPLY+=($(compgen -f -- "$cur"))
    fi
}}
complete -F _tide tide
"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + bash
    return bash
