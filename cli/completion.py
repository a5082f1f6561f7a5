"""Shell completion: `llmgw-cli --install-completion` installs it, `llmgw-cli completion
SHELL` prints it."""

from __future__ import annotations

from typing import Annotated, Literal

from cyclopts import App, Parameter

from cli.render import EXIT_OK, print_block

PROGRAM = "llmgw-cli"

Shell = Literal["bash", "zsh", "fish", "powershell"]


def register_completion(app: App) -> None:
    app.register_install_completion_command(
        help="Install shell completion for your shell (bash, zsh, fish or PowerShell) and "
        "load it from its startup file: `llmgw-cli --install-completion --shell bash`."
    )

    @app.command(name="completion")
    def completion(shell: Annotated[Shell, Parameter(help="The shell to complete in.")], /) -> int:
        """Print the completion script for a shell, to load it yourself.

        ```
        eval "$(llmgw-cli completion bash)"
        llmgw-cli completion zsh > ~/.zsh/completions/_llmgw-cli
        ```
        """
        print_block(app.generate_completion(prog_name=PROGRAM, shell=shell))
        return EXIT_OK
