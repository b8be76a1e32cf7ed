"""Diagnostics: logs (KILN_LOGS), explain(), the KILN_DEBUG dump, reports and bisect.

Stages import only `kiln.debug.log`; everything else here reads the stages' IR objects.
"""
