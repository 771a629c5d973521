"""The `egbert` commands' command lines: `egbert COMMAND` runs `main(argv)` of the module
`egbert.commands.COMMAND` (`prompt-eval`: `prompt_eval.py`). Each parses the command line into
the job's option dataclasses (egbert.arguments) and calls the job's library function, then
prints what the command reports (egbert/cli.py)."""
