"""The one error type of data preparation: bad input, reported as one line, exit 2."""


class PrepareError(ValueError):
    """A problem with what the user asked for (a path, a field, a folder, a number).

    `layerdrop prepare` prints it as ``error: <message>`` and exits with status 2;
    it is raised before any expensive step where the problem can be seen that early.
    """
