"""Bad sandbox configuration gets a clear error naming the field and the fix — before anything runs."""

from __future__ import annotations

import pytest

from whale.sandbox import Isolation, Limits, SandboxSetupError, SandboxWorker, run_python


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"read_paths": ("relative/dir",)}, "Isolation.read_paths entries must be absolute paths"),
        ({"read_paths": ("/",)}, "Isolation.read_paths must not contain '/'"),
        ({"read_paths": "/usr"}, "Isolation.read_paths must be a sequence of strings"),
        ({"packages": ("numpy.linalg",)}, "Isolation.packages entries must be top-level package names"),
        ({"pass_env": ("AWS_SECRET_ACCESS_KEY",)}, "credential-like variables"),
        ({"level": "off"}, "Isolation.level must be one of"),
    ],
)
def test_isolation_refuses_bad_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Isolation(**kwargs)


@pytest.mark.parametrize("field", ["scratch_bytes", "scratch_files", "collect_bytes", "stdout_bytes"])
def test_limits_refuse_empty_budgets(field):
    with pytest.raises(ValueError, match=f"Limits.{field} must be > 0"):
        Limits(**{field: 0})


def test_missing_read_path_and_package_are_named(tmp_path):
    with pytest.raises(SandboxSetupError, match=r"Isolation.read_paths: .*/nope does not exist"):
        run_python("pass", isolation=Isolation(read_paths=(str(tmp_path / "nope"),)))
    with pytest.raises(SandboxSetupError, match="Isolation.packages: 'no_such_package_xyz' is not installed"):
        run_python("pass", isolation=Isolation(packages=("no_such_package_xyz",)))
    with pytest.raises(SandboxSetupError, match=r"sys_path: .*/gone does not exist"):
        SandboxWorker(entry_code="x = 1\n", sys_path=[str(tmp_path / "gone")]).start()


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", "", "./x"])
def test_file_names_must_stay_in_scratch(name):
    with pytest.raises(ValueError, match="escapes the scratch directory"):
        run_python("pass", files={name: "x"})
    with pytest.raises(ValueError, match="escapes the scratch directory"):
        run_python("pass", collect=[name])


def test_files_larger_than_the_scratch_are_a_setup_error():
    with pytest.raises(SandboxSetupError, match="raise Limits.scratch_bytes"):
        run_python("pass", files={"big.bin": b"x" * (2 << 20)}, limits=Limits(scratch_bytes=1 << 20))


def test_allow_listed_read_path_is_read_only_at_its_own_path(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "table.txt").write_text("allowed content")
    code = (
        f"print(open({str(shared / 'table.txt')!r}).read())\n"
        f"try:\n    open({str(shared / 'new.txt')!r}, 'w')\nexcept OSError as e:\n    print('write refused', type(e).__name__)\n"
        f"import os\nprint(sorted(os.listdir({str(tmp_path)!r})))\n"
    )
    r = run_python(code, isolation=Isolation(read_paths=(str(shared),)))
    assert r.ok, r.stderr
    assert "allowed content" in r.stdout and "write refused PermissionError" in r.stdout
    assert "['shared']" in r.stdout  # the parent exists only as the way to the allowed directory
    assert not (shared / "new.txt").exists()
    assert r.isolation["read_paths"] == [str(shared)]
