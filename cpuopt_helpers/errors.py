"""The one exception type for mistakes a user can fix."""


class CpuoptError(Exception):
    """Bad input or a missing piece; the message says what is wrong and what to do."""
