"""The ROCm install against the AMD wheels, and onnxruntime distribution conflicts (RECORD ownership)."""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

from onnxaccel.system.findings import ERROR
from onnxaccel.system.packages import OrtInstall, _record_matches, inspect_ort_install, package_findings
from onnxaccel.system.rocm import inspect_rocm, rocm_findings

MIGRAPHX_WHEEL = {"onnxruntime-migraphx": "1.27.1"}


def _rocm_tree(root: Path, version: str, hip: str, migraphx: bool) -> Path:
    (root / ".info").mkdir(parents=True)
    (root / ".info" / "version").write_text(version + "\n")
    (root / "lib").mkdir()
    (root / "lib" / f"libamdhip64.so.{hip}").write_bytes(b"")
    if migraphx:
        (root / "lib" / "libmigraphx_c.so.3").write_bytes(b"")
    return root


def test_rocm6_hip_soname_cannot_serve_the_migraphx_wheel(tmp_path):
    install = inspect_rocm(_rocm_tree(tmp_path / "rocm-6.4.1", "6.4.1-120", "6", migraphx=True))
    assert install.version == "6.4.1-120" and install.hip_sonames == ["6"]
    codes = {f.code: f.severity for f in rocm_findings(install, MIGRAPHX_WHEEL, amd_gpu=True)}
    assert codes["rocm-hip-too-old"] == ERROR


def test_rocm7_without_migraphx_library_is_an_error_and_with_it_consistent(tmp_path):
    bare = inspect_rocm(_rocm_tree(tmp_path / "a" / "rocm-7.0.2", "7.0.2-56", "7", migraphx=False))
    assert "migraphx-missing" in {f.code for f in rocm_findings(bare, MIGRAPHX_WHEEL, amd_gpu=True)}
    full = inspect_rocm(_rocm_tree(tmp_path / "b" / "rocm-7.0.2", "7.0.2-56", "7", migraphx=True))
    codes = {f.code for f in rocm_findings(full, MIGRAPHX_WHEEL, amd_gpu=True)}
    assert "rocm-consistent" in codes and "rocm-hip-too-old" not in codes


def test_two_rocm_releases_side_by_side_are_flagged(tmp_path):
    _rocm_tree(tmp_path / "rocm-6.4.1", "6.4.1", "6", migraphx=True)
    install = inspect_rocm(_rocm_tree(tmp_path / "rocm-7.0.2", "7.0.2", "7", migraphx=True))
    assert install.releases == ["rocm-6.4.1", "rocm-7.0.2"]
    assert "rocm-several-releases" in {f.code for f in rocm_findings(install, {}, amd_gpu=True)}


def test_missing_rocm_with_an_amd_wheel_is_an_error(tmp_path):
    install = inspect_rocm(tmp_path / "nowhere")
    [finding] = rocm_findings(install, MIGRAPHX_WHEEL, amd_gpu=False)
    assert (finding.code, finding.severity) == ("rocm-missing", ERROR)


def test_this_venv_has_one_intact_onnxruntime_and_no_conflict():
    install = inspect_ort_install()
    assert install.distributions == {"onnxruntime": metadata.version("onnxruntime")}
    assert install.module_package == "onnxruntime" and install.overwritten == []
    assert [f.code for f in package_findings(install, None)] == ["ort-installed"]


def test_two_distributions_conflict_and_the_one_matching_the_gpu_is_kept():
    install = OrtInstall({"onnxruntime": "1.32.0", "onnxruntime-migraphx": "1.27.1"}, module_package="onnxruntime-migraphx")
    [amd] = [f for f in package_findings(install, "amd") if f.code == "ort-conflict"]
    assert "Keep onnxruntime-migraphx (an AMD GPU is present), uninstall onnxruntime" in amd.fix
    assert "pip uninstall -y onnxruntime onnxruntime-migraphx && pip install onnxruntime-migraphx==1.27.1" in amd.fix
    [none] = [f for f in package_findings(install, None) if f.code == "ort-conflict"]
    assert "Keep onnxruntime (no GPU was found)" in none.fix


def test_record_hashes_tell_whether_a_distributions_files_are_still_its_own(tmp_path):
    site = Path(inspect_ort_install().module_path).parent
    copy = tmp_path / "site" / "onnxruntime" / "capi"
    copy.mkdir(parents=True)
    for rel in ("onnxruntime/capi/build_and_package_info.py", "onnxruntime/__init__.py"):
        shutil.copy(site / rel, tmp_path / "site" / rel)
    assert _record_matches("onnxruntime", tmp_path / "site")
    # What another wheel's copy looks like: same file, another package_name (rocm_facts.md §1.2 wheels).
    info = copy / "build_and_package_info.py"
    info.write_text(info.read_text().replace("'onnxruntime'", "'onnxruntime-migraphx'"))
    assert not _record_matches("onnxruntime", tmp_path / "site")


def test_module_files_from_another_distribution_are_reported_as_a_mixed_install():
    install = OrtInstall({"onnxruntime": "1.32.0", "onnxruntime-migraphx": "1.27.1"},
                         module_package="onnxruntime-migraphx", overwritten=["onnxruntime"])
    [mixed] = [f for f in package_findings(install, None) if f.code == "ort-module-mixed"]
    assert "belong to onnxruntime-migraphx, not to onnxruntime" in mixed.title
