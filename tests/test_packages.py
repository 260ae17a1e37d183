"""The packages of ``scripts/package`` (docs/install.md), built and installed.

The bookworm .deb goes into a fresh ``debootstrap --variant=minbase bookworm`` root (built
once, cached under /var/tmp/bbstage-pkg-roots, each test run on an overlay of it: the cached
root stays as built) with ``dpkg -i`` and ``apt-get -f install``, as a site installs it; the
trixie .deb's venv runs in a trixie root; the offline bundles install with pip from their
wheels alone; the RPM is built, linted, and its scriptlets build and remove the venv in a
root that has python3.11 (bookworm's: no EL9 root is at hand). Needs root, debootstrap and
the network the first time (~5 min); ~2-3 min on a warm machine (packages and roots cached).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage import __version__

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "dist"
ROOTS = Path(os.environ.get("BBSTAGE_PKG_ROOTS", "/var/tmp/bbstage-pkg-roots"))
APT_ARCHIVES = Path("/var/tmp/bbstage-pkg-apt/archives")  # the fresh roots' downloads, kept
MIRROR = os.environ.get("BBSTAGE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
MARKER = ".bbstage-pkg-root"
DEB12 = DIST / f"bbstage_{__version__}-1~deb12_amd64.deb"
DEB13 = DIST / f"bbstage_{__version__}-1~deb13_amd64.deb"
RPM = DIST / f"bbstage-{__version__}-1.el9.x86_64.rpm"
APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "-y", "-q"]
PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
# rpmlint's findings that follow from the design (docs/install.md, "Packages"): a venv under
# /opt built in %post (so the symlink dangles in the package), wheels as data, no signing.
RPMLINT_ACCEPTED = {
    "dir-or-file-in-opt",
    "no-signature",
    "no-packager-tag",
    "no-group-tag",
    "no-binary",
}


def offline(tag: int) -> Path:
    return DIST / f"bbstage-{__version__}-offline-py{tag}.tar.gz"


pytestmark = [
    pytest.mark.packages,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (debootstrap, chroot, mounts)"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="needs debootstrap"),
]


def run(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def apt_install(*packages: str) -> None:
    """Debian packages of the host, as scripts/local-cluster installs them."""
    if run(*APT, "install", "--no-install-recommends", *packages, check=False).returncode:
        run(*APT, "update")
        run(*APT, "install", "--no-install-recommends", *packages)


def in_root(root: Path, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` chrooted into root, in a clean environment."""
    env = ["env", "-i", PATH, "LANG=C.UTF-8", "HOME=/root", "DEBIAN_FRONTEND=noninteractive"]
    return run(*env, "chroot", str(root), "sh", "-c", script, check=check)


def minbase_root() -> Path:
    """A fresh ``debootstrap --variant=minbase bookworm`` root with apt's lists, built once
    into a temporary directory renamed when complete."""
    root = ROOTS / "bookworm-minbase"
    if (root / MARKER).is_file():
        return root
    assert not root.exists(), f"{root} exists but is no complete root (no {MARKER}): remove it"
    tmp = root.with_name(root.name + ".build")
    shutil.rmtree(tmp, ignore_errors=True)
    ROOTS.mkdir(parents=True, exist_ok=True)
    run("debootstrap", "--variant=minbase", "bookworm", str(tmp), MIRROR)
    run("chroot", str(tmp), "apt-get", "update", "-q")
    (tmp / MARKER).write_text("debootstrap bookworm (minbase)\n")
    tmp.rename(root)
    return root


@contextlib.contextmanager
def overlay(lower: Path, tmp: Path) -> Iterator[Path]:
    """``lower`` as a writable root (an overlay: lower itself stays as it is), with /proc,
    /dev and the kept apt downloads; unmounted after."""
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "root"
    for d in (upper, work, merged):
        d.mkdir(parents=True)
    mounts: list[Path] = []
    try:
        opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
        run("mount", "-t", "overlay", "overlay", "-o", opts, str(merged))
        mounts.append(merged)
        run("mount", "-t", "proc", "proc", str(merged / "proc"))
        mounts.append(merged / "proc")
        run("mount", "--bind", "/dev", str(merged / "dev"))
        mounts.append(merged / "dev")
        APT_ARCHIVES.joinpath("partial").mkdir(parents=True, exist_ok=True)
        run("mount", "--bind", str(APT_ARCHIVES), str(merged / "var/cache/apt/archives"))
        mounts.append(merged / "var/cache/apt/archives")
        yield merged
    finally:
        for m in reversed(mounts):
            run("umount", "-l", str(m), check=False)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def packages() -> None:
    """Every package, built by scripts/package (idempotent: unchanged inputs, no rebuild)."""
    env = {**os.environ, "PYTHON": sys.executable}
    result = run(str(REPO / "scripts/package"), check=False, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    for f in (DEB12, DEB13, RPM, offline(311), offline(313)):
        assert f.is_file(), f"scripts/package made no {f.name}\n{result.stderr[-2000:]}"


@pytest.fixture(scope="module")
def deb12_root(packages, tmp_path_factory) -> Iterator[Path]:
    """A fresh bookworm root with the bookworm .deb installed as a site does."""
    with overlay(minbase_root(), tmp_path_factory.mktemp("deb12")) as root:
        shutil.copy(DEB12, root / "tmp")
        # dpkg -i stops on the missing dependencies; apt-get -f install brings them.
        in_root(root, f"dpkg -i /tmp/{DEB12.name}", check=False)
        fix = in_root(root, f"apt-get {' '.join(APT[1:])} -f install", check=False)
        if fix.returncode:  # lists older than the mirror: fetch them again
            in_root(root, "apt-get -q update")
            in_root(root, f"apt-get {' '.join(APT[1:])} -f install")
        yield root


def test_deb12_installed_with_its_dependencies(deb12_root: Path) -> None:
    status = in_root(deb12_root, "dpkg-query -W -f '${Status} ${Version}' bbstage").stdout
    assert status == f"install ok installed {__version__}-1~deb12"
    # python3.11 and lua-socket came with it (Depends); Slurm did not (Recommends).
    have = in_root(deb12_root, "dpkg-query -W -f '${Package} ${Status}\\n'").stdout
    installed = {ln.split()[0] for ln in have.splitlines() if ln.endswith("installed")}
    assert {"python3.11", "lua-socket"} <= installed
    assert "slurmctld" not in installed
    fields = run("dpkg-deb", "-f", str(DEB12), "Depends", "Recommends").stdout
    assert "python3.11" in fields and "lua-socket" in fields and "slurmctld" in fields


def test_deb12_bbstage_on_path_runs_from_opt(deb12_root: Path) -> None:
    out = in_root(deb12_root, "/usr/bin/bbstage --version").stdout
    assert __version__ in out and "/opt/bbstage/lib/python3.11/site-packages/bbstage" in out


def test_deb12_unit_verifies(deb12_root: Path) -> None:
    unit = deb12_root / "lib/systemd/system/bbstage.service"
    assert "ExecStart=/opt/bbstage/bin/bbstage " in unit.read_text()
    # The root's own systemd-analyze (systemd installed for it: a daemon host has it); it
    # checks, among others, that ExecStart's program exists and is executable.
    in_root(deb12_root, f"apt-get {' '.join(APT[1:])} install --no-install-recommends systemd")
    result = in_root(
        deb12_root, "systemd-analyze verify /lib/systemd/system/bbstage.service", check=False
    )
    assert result.returncode == 0, result.stderr
    assert "bbstage.service" not in result.stderr, result.stderr


def test_deb12_conffile_and_not_started(deb12_root: Path) -> None:
    conffiles = in_root(deb12_root, "dpkg-query -W -f '${Conffiles}' bbstage").stdout
    assert "/etc/bbstage/bbstage.toml" in conffiles
    # Installed, never enabled: the admin configures the pools first.
    assert not list((deb12_root / "etc/systemd/system").rglob("bbstage*"))
    docs = deb12_root / "usr/share/doc/bbstage"
    assert (docs / "operations.md").is_file() and (docs / "examples/bbstage.service").is_file()
    # Every file of daemon/ comes along, whatever daemon/ holds.
    for f in (REPO / "daemon").iterdir():
        assert (docs / "examples" / f.name).is_file(), f.name


def test_deb12_install_lua_and_config_check(deb12_root: Path) -> None:
    lua = in_root(deb12_root, "bbstage install-lua --lua 5.1 --dest /etc/slurm")
    assert (deb12_root / "etc/slurm/burst_buffer.lua").is_file(), lua.stderr
    assert (deb12_root / "etc/slurm/bbstage/main.lua").is_file()
    check = in_root(deb12_root, "bbstage config check", check=False)
    assert "Traceback" not in check.stderr, check.stderr
    assert check.stdout.strip() or check.stderr.strip()


def test_deb12_purge_removes_opt(deb12_root: Path) -> None:
    # Files Python writes at run time (bytecode caches) are not dpkg's: postrm takes them.
    in_root(deb12_root, "/opt/bbstage/bin/python -c 'import bbstage.cli.main'")
    in_root(deb12_root, "dpkg --purge bbstage")
    for path in (
        "opt/bbstage",
        "usr/bin/bbstage",
        "etc/bbstage",
        "lib/systemd/system/bbstage.service",
    ):
        assert not (deb12_root / path).exists(), path


def test_deb13_venv_is_trixies_python(packages, tmp_path: Path) -> None:
    fields = run("dpkg-deb", "-f", str(DEB13), "Version", "Depends").stdout
    assert f"{__version__}-1~deb13" in fields and "python3.13" in fields
    with overlay(ROOTS / "trixie", tmp_path / "ov") as root:
        run("dpkg-deb", "-x", str(DEB13), str(root))
        out = in_root(
            root,
            "/opt/bbstage/bin/python -c 'import sys, bbstage; "
            "print(sys.version_info[:2], bbstage.__file__)' && /usr/bin/bbstage --version",
        ).stdout
        assert "(3, 13) /opt/bbstage/lib/python3.13/site-packages/bbstage/" in out
        assert __version__ in out
        assert (root / "usr/lib/systemd/system/bbstage.service").is_file()
        # The offline bundle for 3.13, into a venv of trixie's python3.13.
        run("tar", "-xzf", str(offline(313)), "-C", str(root / "tmp"))
        wheels = f"/tmp/bbstage-{__version__}-offline-py313/wheels"
        out = in_root(
            root,
            f"python3.13 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index "
            f"--find-links {wheels} bbstage && /tmp/v/bin/bbstage --version",
        ).stdout
        assert __version__ in out and "/tmp/v/lib/python3.13/" in out


def python311() -> str:
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        pytest.fail("no python3.11 for the py311 bundle (Debian 12: apt-get install python3)")
    return found


def test_offline_bundle_installs_without_an_index(packages, tmp_path: Path) -> None:
    with tarfile.open(offline(311)) as tar:
        names = tar.getnames()
    run("tar", "-xzf", str(offline(311)), "-C", str(tmp_path))
    bundle = tmp_path / f"bbstage-{__version__}-offline-py311"
    assert f"{bundle.name}/INSTALL" in names
    assert (bundle / f"wheels/bbstage-{__version__}-py3-none-any.whl").is_file()
    # No pip configuration of this machine (its local indexes): the bundle's wheels alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    venv = tmp_path / "venv"
    run(python311(), "-m", "venv", str(venv), env=env)
    pip = [str(venv / "bin/pip"), "install", "-q", "--no-index", "--find-links"]
    run(*pip, str(bundle / "wheels"), "bbstage", env=env)
    out = run(str(venv / "bin/bbstage"), "--version", env=env).stdout.replace("\n", "")
    assert __version__ in out and str(venv) in out
    config = tmp_path / "bbstage.toml"
    config.write_text(
        f'[daemon]\nsocket = "{tmp_path}/control.sock"\nstate_dir = "{tmp_path}/state"\n'
    )
    dest = tmp_path / "etc"
    cmd = [str(venv / "bin/bbstage"), "--config", str(config), "install-lua"]
    run(*cmd, "--dest", str(dest), "--lua", "5.1", env=env)
    assert (dest / "burst_buffer.lua").is_file() and (dest / "bbstage_site.lua").is_file()


def test_rpm_built_and_linted(packages) -> None:
    query = run("rpm", "-qp", "--configfiles", str(RPM)).stdout
    assert "/etc/bbstage/bbstage.toml" in query
    requires = run("rpm", "-qp", "--requires", str(RPM)).stdout
    assert "python3.11" in requires and "lua-socket" in requires
    files = run("rpm", "-qlp", str(RPM)).stdout
    assert f"/usr/share/bbstage/wheels/bbstage-{__version__}-py3-none-any.whl" in files
    assert "cp311" in files and "/usr/lib/systemd/system/bbstage.service" in files
    if shutil.which("rpmlint") is None:
        apt_install("rpmlint")
    spec = DIST / ".build/rpm/SPECS/bbstage.spec"  # the one rpmbuild read, version written in
    lint = run("rpmlint", str(spec), str(RPM), check=False)
    errors = {ln.split()[2] for ln in lint.stdout.splitlines() if ": E: " in ln}
    assert errors <= RPMLINT_ACCEPTED, lint.stdout


def test_rpm_scriptlets_build_and_remove_the_venv(packages, tmp_path: Path) -> None:
    """%post and %postun as rpm would run them, in a root with python3.11 (and its venv
    module, as EL9's python3.11 has): bookworm's, with the RPM's files unpacked into it."""
    scripts = {}
    for tag in ("POSTIN", "POSTUN"):
        scripts[tag] = run("rpm", "-qp", "--qf", f"%{{{tag}}}", str(RPM)).stdout
    assert "python3.11 -m venv /opt/bbstage" in scripts["POSTIN"]
    with overlay(ROOTS / "bookworm", tmp_path / "ov") as root:
        payload = subprocess.Popen(["rpm2cpio", str(RPM)], stdout=subprocess.PIPE)
        run("cpio", "-idm", "--quiet", "-D", str(root), stdin=payload.stdout)
        assert payload.wait() == 0
        (root / "tmp/post").write_text(scripts["POSTIN"])
        (root / "tmp/postun").write_text(scripts["POSTUN"])
        in_root(root, "sh -e /tmp/post 1")
        out = in_root(root, "/usr/bin/bbstage --version").stdout
        assert __version__ in out and "/opt/bbstage/lib/python3.11/" in out
        in_root(root, "sh -e /tmp/postun 0")
        assert not (root / "opt/bbstage/bin").exists()


def test_the_sdist_carries_the_shipped_files_and_builds_a_complete_wheel(tmp_path: Path) -> None:
    """The sdist holds lua/ and daemon/ as the checkout does; a wheel built from it (as pip
    does from PyPI) has them in bbstage/share/."""
    run(sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path), str(REPO))
    (sdist,) = tmp_path.glob("bbstage-*.tar.gz")
    tracked = run("git", "-C", str(REPO), "ls-files", "lua", "daemon").stdout.split()
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert set(tracked) <= names
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(sdist))
    (wheel,) = tmp_path.glob("bbstage-*.whl")
    assert {f"bbstage/share/{p}" for p in tracked} <= set(zipfile.ZipFile(wheel).namelist())
