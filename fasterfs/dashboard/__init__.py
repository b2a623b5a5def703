"""FasterFS's dashboard on the head, its figures, and JupyterLab beside it."""
