import gzip
import os
import re
import shutil
import subprocess
from collections import Counter

import pytest

from data_prep.man_page import expand_escapes, render_man_page


def test_title_headings_and_escapes():
    page = "\n".join([
        '.TH LS 1 "2022" "GNU" "User Commands"',
        ".SH NAME",
        r"ls \- list directory contents",
        ".SH DESCRIPTION",
        r"Sort \fBentries\fR \(em see \*(lqmore\*(rq, caf\[u00E9] \e x",
    ])
    assert render_man_page(page) == (
        "LS(1)\n\nNAME\nls - list directory contents\n\nDESCRIPTION\n"
        "Sort entries \u2014 see \u201cmore\u201d, caf\u00e9 \\ x\n")


def test_font_macros_join_or_space_their_arguments():
    page = ".BR ls (1),\n.B two words\n.IR file .txt\n.B \"quoted arg\" next"
    assert render_man_page(page).splitlines() == ["ls(1),", "two words", "file.txt", "quoted arg next"]


def test_layout_requests_comments_and_macro_definitions_vanish():
    page = "\n".join([r'.\" a comment', ".de XX", "secret body", "..", ".nh", ".ad l", ".RS 4",
                      "kept text", ".RE", ".PD 0", ".ig", "ignored", "..", r"more \" trailing comment"])
    assert render_man_page(page).splitlines() == ["kept text", "more"]


def test_conditionals_take_the_terminal_branch():
    page = "\n".join([".ie n \\{\\", "terminal", ".\\}", ".el \\{\\", "typesetter", ".\\}",
                      ".if t printed only on paper", ".if n on a terminal", "after"])
    assert render_man_page(page).splitlines() == ["terminal", "on a terminal", "after"]


def test_tables_keep_their_cells():
    page = "\n".join([".TS", "tab(\t);", "l l.", "name\tvalue", "_", "T{\nlong\nT}\tx", ".TE", "done"])
    lines = render_man_page(page).splitlines()
    assert lines[0] == "name  value"
    assert "done" in lines and "l l." not in lines and "_" not in lines


def test_mdoc_pages():
    page = "\n".join([".Dd May 1, 2020", ".Dt SSH 1", ".Sh NAME", ".Nm ssh", ".Nd remote login",
                      ".Sh DESCRIPTION", ".Nm", "connects;", ".Fl v", "is verbose, see", ".Xr ssh_config 5 ."])
    assert render_man_page(page).splitlines() == [
        "SSH(1)", "", "NAME", "ssh", "- remote login", "", "DESCRIPTION", "ssh", "connects;", "-v",
        "is verbose, see", "ssh_config(5)"]


def test_redirect_pages_render_empty():
    assert render_man_page(".so man1/other.1\n") == ""


def test_escapes_with_arguments_are_removed():
    assert expand_escapes(r"a\h'-04'b\s-1c\s0\v'2'd\kxe\n(.gf") == "abcdef"


MAN_PAGES = ["/usr/share/man/man1/ls.1.gz", "/usr/share/man/man1/tar.1.gz", "/usr/share/man/man7/signal.7.gz"]


@pytest.mark.skipif(shutil.which("groff") is None, reason="needs groff as the reference renderer")
@pytest.mark.parametrize("path", MAN_PAGES)
def test_words_match_groff(path):
    """The renderer keeps groff's words (hyphenation and page headers aside)."""
    if not os.path.exists(path):
        pytest.skip(f"{path} not installed")
    source = gzip.open(path).read().decode("utf-8", "replace")
    reference = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou"], input=source, capture_output=True,
                               text=True, check=True).stdout
    ours, theirs = Counter(re.findall(r"\w+", render_man_page(source))), Counter(re.findall(r"\w+", reference))
    common = sum((ours & theirs).values())
    assert common / sum(theirs.values()) > 0.93  # recall (groff hyphenates some words)
    assert common / sum(ours.values()) > 0.95  # precision
