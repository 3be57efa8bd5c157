"""Generate the tiny otter-assign master notebook (tiny.ipynb)."""
import nbformat as nbf
from nbformat.v4 import new_notebook, new_code_cell, new_raw_cell, new_markdown_cell

cells = [
    new_raw_cell("# ASSIGNMENT CONFIG\nname: tiny\ngenerate: true\nexport_cell: false\ncheck_all_cell: false\ninit_cell: true\n"),
    new_markdown_cell("# Tiny assignment"),
    # ---- q1
    new_raw_cell("# BEGIN QUESTION\nname: q1\npoints: 2"),
    new_markdown_cell("**Question 1.** Write `square(x)` returning x squared."),
    new_raw_cell("# BEGIN SOLUTION"),
    new_code_cell("def square(x):\n    return x * x  # SOLUTION"),
    new_raw_cell("# END SOLUTION"),
    new_raw_cell("# BEGIN TESTS"),
    new_code_cell("assert square(3) == 9"),
    new_code_cell("# HIDDEN\nassert square(-4) == 16, 'HIDDEN_Q1_SECRET: square(-4) must be 16'"),
    new_raw_cell("# END TESTS"),
    new_raw_cell("# END QUESTION"),
    # ---- q2
    new_raw_cell("# BEGIN QUESTION\nname: q2\npoints: 2"),
    new_markdown_cell("**Question 2.** Write `fib(n)` returning the n-th Fibonacci number (fib(0)=0, fib(1)=1)."),
    new_raw_cell("# BEGIN SOLUTION"),
    new_code_cell("def fib(n):\n    # BEGIN SOLUTION\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n    # END SOLUTION"),
    new_raw_cell("# END SOLUTION"),
    new_raw_cell("# BEGIN TESTS"),
    new_code_cell("assert fib(1) == 1"),
    new_code_cell("# HIDDEN\nassert fib(10) == 55  # HIDDEN_Q2_SECRET"),
    new_raw_cell("# END TESTS"),
    new_raw_cell("# END QUESTION"),
]
nb = new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "tiny.ipynb")
print("wrote tiny.ipynb")
