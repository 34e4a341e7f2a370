"""The one exception the course raises for problems a learner can fix.

Every message is a short sentence that says what went wrong and what to do.
Notebooks and the command line show just that sentence, never a long traceback
from deep inside a library.
"""


class CourseError(Exception):
    """A problem with a clear fix, explained in one or two sentences."""


def short_traceback_in_ipython() -> None:
    """Make IPython print a CourseError as one line instead of a traceback.

    Other exceptions keep their normal traceback: they are bugs and we want to see them.
    """
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: nothing to do
        return
    ip = get_ipython()
    if ip is None:
        return

    def _show(shell, etype, value, tb, tb_offset=None):
        print(f"CourseError: {value}")
        return None

    ip.set_custom_exc((CourseError,), _show)
