"""The command-line tools, and :mod:`tools.workshop`, what several of them share. A regular
package, so that ``tools.workshop`` is this folder's even where another ``tools`` is installed; the
scripts put the folder above it on ``sys.path`` before importing the workshop."""
