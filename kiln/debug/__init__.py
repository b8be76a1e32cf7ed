"""Diagnostics: explain(), the KILN_DEBUG dump, reports and bisect.

Everything here reads the stages' IR objects; no stage imports this package (logging is kiln.log).
"""
