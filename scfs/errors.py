"""The error a user sees as one line.

`ReportedError` marks exceptions whose message is complete for the user (what happened, what was kept, what to
do next): the CLIs print it as one line without a traceback (`scfs.cli`). A leaf module, so any package can raise
one without importing the CLI.
"""


class ReportedError(Exception):
    """Mixed into an error class (first base) whose message names the problem and the fix."""
