"""The book's colours, defined once.

Every graph picture and every matplotlib plot in the chapters takes its colours
from here, so blue means the same thing on every page::

    ax.plot(steps, loss, color=gp.palette.BLUE)
"""

BLUE = "#1f5fa8"  # the gradient path; the first line of a plot
RED = "#d62728"  # a cut (detach, detach_, .data); the line to compare against
PURPLE = "#7b3294"  # hooks
GREY = "#9a9a9a"  # the outline of a value that receives no gradient
ORANGE = "#c75000"  # a chain a picture points at (backward_graph(highlight=...))

# Lighter shades of the same colours, for fills, text and thin lines.
BLUE_FILL = "#dbe9f7"
PURPLE_FILL = "#f3e8f7"
GREY_FILL = "#eeeeee"
GREY_TEXT = "#8a8a8a"
GREY_LINE = "#b0b0b0"
ORANGE_FILL = "#fde3cc"
