import pytest

from kernelab._loader import check_signature, load_callable


def test_loads_a_function_from_a_file_outside_the_project(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("def double(x):\n    return 2 * x\n")
    assert load_callable(f"{f}:double")(x=3) == 6


def test_loads_from_a_module():
    assert load_callable("math:sqrt")(4.0) == 2.0


@pytest.mark.parametrize(
    ("spec", "exc", "words"),
    [
        ("nocolon.py", ValueError, "candidate: expected 'path/to/file.py:function'"),
        ("/no/such/file.py:f", FileNotFoundError, "candidate: no such file"),
        ("math:nosuch", ValueError, "has no attribute 'nosuch'"),
        ("math:pi", ValueError, "is not callable"),
        ("no_such_module_xyz:f", ValueError, "cannot import module"),
    ],
)
def test_bad_specs_give_one_clear_line(spec, exc, words):
    with pytest.raises(exc, match=words):
        load_callable(spec)


def test_a_file_that_fails_to_import_is_reported(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=r"importing .* failed: RuntimeError: boom"):
        load_callable(f"{f}:g")


def test_signature_mismatch_names_what_differs():
    def good(x, weight, eps=1e-6, residual=None, out=None):
        return x

    def bad(x, w):
        return x

    check_signature(good, ["x", "weight", "eps", "residual"])
    with pytest.raises(ValueError, match=r"does not accept \['weight', 'eps'\]"):
        check_signature(bad, ["x", "weight", "eps"])
