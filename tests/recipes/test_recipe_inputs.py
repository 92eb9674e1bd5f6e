"""framework/recipes/recipe_inputs.py: the command's sizes and counts, read or refused in
one line (the whole command: tests/recipes/test_recipe.py)."""

import pytest

from framework.recipes.recipe_inputs import RecipeError, byte_size, token_count


def test_sizes_and_counts_with_their_units():
    assert byte_size("141GB") == 141e9 and byte_size("80GiB") == 80 * 2**30
    assert token_count("5.4B") == pytest.approx(5.4e9) and token_count("2e9") == 2e9 and token_count("300m") == 3e8


@pytest.mark.parametrize("read, text", [(byte_size, "141"), (byte_size, "0GB"), (token_count, "-3B"),
                                        (token_count, "many")])
def test_a_bad_value_is_one_line_naming_it(read, text):
    with pytest.raises(RecipeError, match=f"={text!r} is invalid") as err:
        read(text)
    assert "\n" not in str(err.value)
