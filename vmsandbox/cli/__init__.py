"""The command line: parsing and printing only. The one place errors become exit codes and where a person
is asked (review prompts, trust). No session policy lives here.

May import anything below it.
"""
