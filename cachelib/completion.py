"""Shell completion scripts (bash, zsh) made from an argparse parser: its subcommands, each one's flags, and
the choices of flags that have them. Pure: the script is returned as text, ``compilecache completion`` prints it.
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if a.help != argparse.SUPPRESS]


def _choices(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    return {s: [str(c) for c in a.choices] for a in parser._actions if a.option_strings and a.choices
            for s in a.option_strings}


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    return [str(c) for a in parser._actions if not a.option_strings and a.choices
            and not isinstance(a, argparse._SubParsersAction) for c in a.choices]


def _valued_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions if a.option_strings and a.nargs != 0 for s in a.option_strings]


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A bash completion function for ``parser.prog``, registered with ``complete``."""
    prog = parser.prog
    func = "_" + prog.replace("-", "_")
    commands = _subparsers(parser)
    cases = []
    for name, sub in sorted(commands.items()):
        choice_cases = "".join(
            f"            {shlex.quote(flag)}) COMPREPLY=($(compgen -W {shlex.quote(' '.join(values))} -- \"$cur\"));"
            " return;;\n"
            for flag, values in sorted(_choices(sub).items())
        )
        cases.append(
            f"        {shlex.quote(name)})\n"
            f"            case \"$prev\" in\n{choice_cases}            esac\n"
            f"            if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W {shlex.quote(' '.join(_flags(sub)))} "
            "-- \"$cur\"))\n"
            + (f"            else COMPREPLY=($(compgen -W {shlex.quote(' '.join(_positional_choices(sub)))} "
               "-- \"$cur\")); fi;;\n"
               if _positional_choices(sub) else "            else COMPREPLY=($(compgen -f -- \"$cur\")); fi;;\n")
        )
    top = " ".join([*sorted(commands), *_flags(parser)])
    return (
        f"# bash completion for {prog}: eval \"$({prog} completion bash)\", or save it under\n"
        f"# ~/.local/share/bash-completion/completions/{prog}\n"
        f"{func}() {{\n"
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} command= i\n"
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        f"        case ${{COMP_WORDS[i]}} in {'|'.join(_valued_flags(parser))}) ((i++)); continue;; esac\n"
        "        if [[ ${COMP_WORDS[i]} != -* ]]; then command=${COMP_WORDS[i]}; break; fi\n"
        "    done\n"
        "    case \"$command\" in\n"
        f"        '') COMPREPLY=($(compgen -W {shlex.quote(top)} -- \"$cur\"));;\n"
        + "".join(cases)
        + "    esac\n"
        "}\n"
        f"complete -o default -F {func} {prog}\n"
    )


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """The bash function under zsh's bash-completion emulation (``bashcompinit``)."""
    return (
        f"#compdef {parser.prog}\n"
        f"# zsh completion for {parser.prog}: eval \"$({parser.prog} completion zsh)\" in ~/.zshrc\n"
        "autoload -U +X compinit && { (( $+functions[compdef] )) || compinit; }\n"
        "autoload -U +X bashcompinit && bashcompinit\n"
        + bash_script(parser)
    )


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    if shell == "bash":
        return bash_script(parser)
    if shell == "zsh":
        return zsh_script(parser)
    raise ValueError(f"no completion for {shell!r}: one of {', '.join(SHELLS)}")
