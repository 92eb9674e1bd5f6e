"""How the report's page prints a table and a p-value."""

from eval.experiments.report.page_table import p_text, table


def test_a_table_is_a_header_a_rule_and_a_line_per_row():
    assert table(["a", "b"], [["1", "2"], ["3", ""]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", "| 3 |  |"]


def test_a_p_value_keeps_two_digits_below_a_thousandth():
    assert [p_text(p) for p in (0.5, 0.0123, 0.001, 0.000123, 2.4e-09)] == ["0.500", "0.012", "0.001", "0.00012",
                                                                             "2.4e-09"]
