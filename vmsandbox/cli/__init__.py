"""The command line: parsing and printing only, over the core (vmsandbox.core). The one place errors become exit
codes and where a person at a terminal is asked (review prompts, trust). No session policy lives here.

main.py (the entry, and the one printer of errors, the parser's too), base.py (apps, the help's panels and rows, exit
codes, shared parameters), aliases.py (`list`/`remove`/`ps` beside `ls`/`rm`, and the hint for a word that is no
command: "did you mean", never a different verb), helptext.py (help as plain text when piped), output.py (listings:
tables, --format, --json, --filter), template/ (--format's Go templates), complete.py and completion.py (the
shell's words), meta.py (help, version, doctor), serve.py (the HTTP API); sessions/ (the everyday verbs on
sessions), review/ (diff, pull, push, the browser's review, the terminal's prompts), nouns/ (each thing acted on
with its verbs: checkpoint, port, policy, image, host, secret, login, config, and config's trust).

May import: vmsandbox.core, vmsandbox.ui, vmsandbox.errors (and the web and API edges it serves, named in the
architecture test). Nothing below the core.
"""
