"""Run first in every kernel that executes a chapter for the book (PYTHONSTARTUP).

A warning is shown as its category and message ("UserWarning: ..."), the way a
reader needs it. Python's default adds the file and line that raised it: for code
in a cell, a temporary file whose name changes with every kernel
(/tmp/ipykernel_3762/3365851320.py:1); for library code, a path that depends on
where the repository was cloned. Both made two builds of the same commit differ.
For the same reason the location in torch's own C++ sources that some of its
warnings end with is left out ("(Triggered internally at .../TensorBody.h:493.)"):
it names a line of the torch build, and moves from one torch release to the next
while the warning stays the same.

It defines no name in the notebook's namespace: a chapter sees what it imports.
"""


def _show_warnings_as_category_and_message():
    import re
    import warnings

    torch_source_line = re.compile(r" \(Triggered internally at [^()]*\)")

    def category_and_message(message, category, filename, lineno, line=None):
        return f"{category.__name__}: {torch_source_line.sub('', str(message))}\n"

    warnings.formatwarning = category_and_message


_show_warnings_as_category_and_message()
del _show_warnings_as_category_and_message
