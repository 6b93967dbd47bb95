"""Reports: the terminal and Markdown report, the HTML report, the operator console."""
