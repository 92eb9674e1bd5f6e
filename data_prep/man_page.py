"""Render a man page (roff source: man or mdoc macros) to plain text, in Python.

Why not groff: groff is missing on some machines, spends ~45 ms per page (minutes
for the ~3,000 pages of the built-in corpus on 2 cores), and its output changes with
its version and the terminal width. This renderer is a deliberately simple roff
*stripper*: it keeps the words, headings, option tags and table cells, drops layout
requests, expands the common escapes and special characters, and keeps the source's
line breaks instead of filling paragraphs. The result is readable English text for
language modelling, the same on every machine.
"""

from __future__ import annotations

import re

# Named characters (`\(xx`, `\[name]`) that appear in real pages; unknown names vanish.
SPECIAL_CHARACTERS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "mi": "-", "bu": "\u2022", "aq": "'",
    "dq": '"', "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019",
    "Fo": "\u00ab", "Fc": "\u00bb", "fo": "\u2039", "fc": "\u203a",
    "co": "\u00a9", "rg": "\u00ae", "tm": "\u2122", "de": "\u00b0", "ti": "~", "ha": "^",
    "rs": "\\", "sl": "/", "ba": "|", "or": "|", "at": "@", "sh": "#", "Do": "$",
    "lh": "<=", "rh": "=>", "->": "->", "<-": "<-", "<=": "<=", ">=": ">=", "!=": "!=",
    "==": "==", "pl": "+", "eq": "=", "mu": "\u00d7", "di": "\u00f7", "+-": "\u00b1",
    "aa": "\u00b4", "ga": "`", "ul": "_", "ru": "_", "sc": "\u00a7", "ps": "\u00b6",
    "dg": "\u2020", "dd": "\u2021", "ct": "\u00a2", "Po": "\u00a3", "Ye": "\u00a5",
    "Eu": "\u20ac", "eu": "\u20ac", "ss": "\u00df", "ae": "\u00e6", "AE": "\u00c6",
    "'e": "\u00e9", "'a": "\u00e1", "`e": "\u00e8", ":u": "\u00fc", ":o": "\u00f6",
    ":a": "\u00e4", "~n": "\u00f1", ",c": "\u00e7", "lB": "[", "rB": "]", "lC": "{",
    "rC": "}", "la": "\u27e8", "ra": "\u27e9", "Lq": "\u201c", "Rq": "\u201d",
}
# Predefined strings (`\*(xx`, `\*[name]`) used by man, mdoc and pod2man pages.
STRINGS = {"R": "\u00ae", "Tm": "\u2122", "lq": "\u201c", "rq": "\u201d", "L\"": "\u201c",
           "R\"": "\u201d", "C`": "'", "C'": "'", "--": "-", "PI": "\u03c0", "Aq": "'"}

# Requests with no visible output (layout, registers, fonts, indentation).
SILENT_REQUESTS = frozenset(
    "IX PD ds nr rr ft fam ad na nh hy hw tr ne in ti ll ps vs cs ss lf ta ns rs pc ev mk rt "
    "ch wh ul cu fi nf RS RE INDENT UNINDENT EX EE Vb Ve TE PS PE UE ME so pso cp do "
    "Dd Dt Os Bl El Bd Ed Ek Bk Ef Ec Ud Rs Re ft fc ec eo lt po pl bp nm nn ".split()
)
PARAGRAPH_REQUESTS = frozenset("PP LP P sp Sp TP HP Pp bP TQ QS QE br Lp".split())
HEADING_REQUESTS = frozenset("SH Sh SS Ss".split())
SPACED_FONT_MACROS = frozenset("B I SM SB".split())
ALTERNATING_FONT_MACROS = frozenset("BR IR RB RI BI IB".split())
# mdoc's callable macros that may appear inside another macro's arguments.
MDOC_CALLABLES = frozenset(
    "Ar Cm Ic Op Oo Oc Pa Xr Ns Em Sy Li Dq Qq Sq Ql Va Ev Er Fa Fn Ft Nm Pq Bq Brq Aq Dl "
    "No Nd Ad Dv Xo Xc Ux Bx At Tn".split()
)

_ESCAPE = re.compile(
    r"""\\(?:
        (?P<comment>["\#].*)                       # \" and \# comments
      | f(?:\[[^\]]*\]|\(..|.)                     # font changes
      | s[-+]?(?:\(..|\[[^\]]*\]|'[^']*'|\d\d?)    # size changes
      | [hvwolLXZNDRbx](?P<q>['|"]).*?(?P=q)       # motions, widths, drawing, glyph numbers
      | n[-+]?(?:\(..|\[[^\]]*\]|.)                # number registers
      | k.                                         # mark horizontal position
      | \*(?P<string>\(..|\[[^\]]*\]|.)            # predefined strings
      | \((?P<char2>..)                            # \(xx special characters
      | \[(?P<charname>[^\]]*)\]                   # \[name] special characters
      | (?P<single>.)                              # one-character escapes
    )""",
    re.VERBOSE,
)
_SINGLE_ESCAPES = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": "\t",
                   "'": "\u00b4", "`": "`", ".": ".", "_": "_", "%": "", "&": "", "|": "",
                   "^": "", ":": "", "/": "", ",": "", "c": "", "!": "", "{": "", "}": "",
                   "a": "", "d": "", "u": "", "p": "", "r": "", "z": ""}


def _named_character(name: str) -> str:
    if name.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}(_[0-9A-Fa-f]{4,6})*", name):
        return "".join(chr(int(part, 16)) for part in name[1:].split("_"))
    return SPECIAL_CHARACTERS.get(name, "")


def _replace_escape(match: re.Match) -> str:
    if match.group("comment") is not None:
        return ""
    if (string := match.group("string")) is not None:
        return STRINGS.get(string.strip("([]"), "")
    if (name := match.group("char2")) is not None:
        return _named_character(name)
    if (name := match.group("charname")) is not None:
        return _named_character(name)
    if (char := match.group("single")) is not None:
        return _SINGLE_ESCAPES.get(char, char)
    return ""  # fonts, sizes, motions, registers


# The escapes that make up most of real pages, replaced without the regex (speed).
_COMMON_ESCAPES = (("\\-", "-"), ("\\fB", ""), ("\\fI", ""), ("\\fR", ""), ("\\fP", ""),
                   ("\\&", ""), ("\\(aq", "'"), ("\\(em", "\u2014"), ("\\(bu", "\u2022"))


def expand_escapes(text: str) -> str:
    """Replace roff escapes in one line of text by the characters they print."""
    if "\\" not in text:
        return text
    if "\\\\" not in text:  # an escaped backslash could pair with the next character
        for escape, replacement in _COMMON_ESCAPES:
            text = text.replace(escape, replacement)
        if "\\" not in text:
            return text
    return _ESCAPE.sub(_replace_escape, text)


_ARGUMENT = re.compile(r'"((?:[^"]|"")*)"?|(\S+)')


def _arguments(rest: str) -> list[str]:
    # roff quotes arguments with "..." and doubles "" for a literal quote inside them.
    return [m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2)
            for m in _ARGUMENT.finditer(rest)]


def _mdoc_words(args: list[str]) -> str:
    words = []
    for word in args:
        if word == "Fl":
            words.append("-")
        elif word not in MDOC_CALLABLES:
            words.append(word)
    return " ".join(words).replace("- ", "-")


def _macro_text(name: str, rest: str) -> str | None:
    """What a macro line prints, or None for a silent request."""
    args = _arguments(rest)
    if name in SPECIAL_CASES:
        return SPECIAL_CASES[name](args)
    if name in SILENT_REQUESTS or name in PARAGRAPH_REQUESTS:
        return None
    if name in ALTERNATING_FONT_MACROS:
        return "".join(args)
    if name in SPACED_FONT_MACROS:
        return " ".join(args)
    return _mdoc_words([name] + args) if name in MDOC_CALLABLES else _mdoc_words(args)


SPECIAL_CASES = {
    "TH": lambda args: f"{args[0]}({args[1]})" if len(args) >= 2 else " ".join(args),
    "Dt": lambda args: f"{args[0]}({args[1]})" if len(args) >= 2 else " ".join(args),
    "IP": lambda args: args[0] if args else None,
    "It": lambda args: _mdoc_words(args) or None,
    "UR": lambda args: args[0] if args else None,
    "MT": lambda args: args[0] if args else None,
    "Xr": lambda args: f"{args[0]}({args[1]})" if len(args) >= 2 else " ".join(args),
    "Fl": lambda args: "-" + _mdoc_words(args),
    "Nd": lambda args: "- " + _mdoc_words(args),
}


class _Renderer:
    """Line-by-line state machine: skipped blocks, conditionals, tables, output lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.skip_until_dots = False  # inside .de/.ig ... ..
        self.skip_depth = 0  # inside a false \{ ... \} conditional block
        self.last_condition = True  # the .ie condition, for the matching .el
        self.table_state: str | None = None  # None | "format" | "data"
        self.join_next = False  # the previous line ended with \c
        self.page_name = ""  # mdoc: a bare `.Nm` prints the name given by the first `.Nm`

    def emit(self, text: str) -> None:
        text = expand_escapes(text).rstrip()
        if self.join_next and self.lines:
            self.lines[-1] = (self.lines[-1] + " " + text.lstrip()).rstrip()
        else:
            self.lines.append(text)

    def paragraph_break(self) -> None:
        if self.lines and self.lines[-1] != "":
            self.lines.append("")

    def feed(self, line: str) -> None:
        if self.skip_until_dots:
            self.skip_until_dots = not line.startswith("..")
            return
        if self.skip_depth:
            self.skip_depth += line.count("\\{") - line.count("\\}")
            self.skip_depth = max(self.skip_depth, 0)
            return
        if self.table_state is not None and self._table_line(line):
            return
        if line[:1] in (".", "'"):
            self._control_line(line[1:].lstrip())
            return
        self.emit_text(line)

    def emit_text(self, line: str) -> None:
        line = line.replace("\\}", "").replace("\\{", "")
        joins = line.rstrip().endswith("\\c")
        self.emit(line)
        self.join_next = joins

    def _table_line(self, line: str) -> bool:
        if line.startswith(".TE"):
            self.table_state = None
            return True
        if self.table_state == "format":
            # tbl's options and column formats end with the line ending in '.'
            if line.rstrip().endswith("."):
                self.table_state = "data"
            return True
        if line.startswith((".", "'")):
            return False
        cells = [cell.strip() for cell in line.replace("T{", "").replace("T}", "").split("\t")]
        if any(cells) and not all(set(cell) <= set("_=") for cell in cells):
            self.emit("  ".join(cells))
        return True

    def _control_line(self, body: str) -> None:
        if body.startswith('\\"') or not body:
            return
        name, _, rest = body.partition(" ")
        name = name.strip()
        if name in ("de", "de1", "am", "ig"):
            self.skip_until_dots = True
        elif name == "TS":
            self.table_state = "format"
        elif name in ("if", "ie", "el"):
            self._conditional(name, rest)
        elif name in HEADING_REQUESTS:
            self.paragraph_break()
            heading = " ".join(_arguments(rest))
            if heading:
                self.emit(heading)
        else:
            self._macro(name, rest)

    def _macro(self, name: str, rest: str) -> None:
        if name in PARAGRAPH_REQUESTS or name in ("IP", "It"):
            self.paragraph_break()
        if name == "Nm":
            self.page_name = self.page_name or rest.split(" ")[0]
            rest = rest if rest.strip() else self.page_name
        text = _macro_text(name, rest)
        if text:
            self.emit(text)
            self.join_next = rest.rstrip().endswith("\\c")

    def _conditional(self, name: str, rest: str) -> None:
        if name == "el":
            holds, body = not self.last_condition, rest
        else:
            condition, _, body = rest.strip().partition(" ")
            # nroff-like: the "n" (terminal) branch holds, "t" (typesetter) and
            # anything we cannot evaluate (registers, string compares) do not.
            holds = condition == "n" or condition == "!t"
            if name == "ie":
                self.last_condition = holds
        body = body.strip()
        opens_block = body.startswith("\\{")
        if opens_block:
            body = body[2:].lstrip("\\").strip()
        if not holds:
            if opens_block:
                self.skip_depth = 1 + body.count("\\{") - body.count("\\}")
            return
        body = body.replace("\\}", "").strip()
        if body:
            self.feed(body)


def render_man_page(source: str) -> str:
    """Plain text of a man page given its roff source ("" for a `.so` redirect page)."""
    if source.lstrip().startswith(".so "):
        return ""
    renderer = _Renderer()
    for line in source.splitlines():
        renderer.feed(line)
    text = "\n".join(renderer.lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
