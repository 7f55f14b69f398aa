"""What Ray startup prints (the dashboard line, no log-level notice)."""

from __future__ import annotations

import os
import sys

import pytest

from esper_ray.train.process.resources import LOG_LEVEL_NOTICE, dashboard_line, native_stderr_without


def test_dashboard_line_says_how_to_sign_in_when_the_cluster_asks_for_a_token():
    with_token = dashboard_line("127.0.0.1:8265", token_auth=True)
    assert with_token.startswith("Ray dashboard: http://127.0.0.1:8265 (") and "`ray get-auth-token`" in with_token
    assert "ray-authentication-token cookie" in with_token and "\n" not in with_token
    assert dashboard_line("127.0.0.1:8265", token_auth=False) == "Ray dashboard: http://127.0.0.1:8265"
    assert "pip install" in dashboard_line(None, token_auth=True)


def test_native_stderr_is_passed_on_without_rays_log_level_notice(capfd):
    with native_stderr_without(LOG_LEVEL_NOTICE):
        # as the core worker writes it: straight to file descriptor 2, not through sys.stderr
        os.write(
            2, b"[2026-01-01 I 1 1] logging.cc:303: " + LOG_LEVEL_NOTICE.encode() + b" RAY_BACKEND_LOG_LEVEL to 3\n"
        )
        os.write(2, b"a real error from C++\n")
        print("python's own warning", file=sys.stderr)
    err = capfd.readouterr().err
    assert "logging.cc" not in err and LOG_LEVEL_NOTICE not in err
    assert sorted(err.splitlines()) == [
        "a real error from C++",
        "python's own warning",
    ]  # (capfd takes sys.stderr apart)
    os.write(2, b"after\n")  # file descriptor 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"


@pytest.mark.expensive
def test_no_address_starts_a_local_ray_even_where_a_cluster_is_recorded_or_named(tmp_path):
    """Without --address the command starts its own Ray. A cluster recorded by `ray start` (ray_current_cluster in
    Ray's temp folder; ray.cluster_utils.Cluster writes it too, so another test module running beside this one did)
    or named by RAY_ADDRESS made ray.init try to join it and refuse the command's num_cpus. Both point nowhere here:
    joining was never what the command asked for."""
    import shutil
    import subprocess
    import tempfile

    temp = tempfile.mkdtemp(prefix="er", dir="/tmp")  # short: Ray's socket paths must fit in 107 characters
    try:
        os.makedirs(os.path.join(temp, "ray"))
        with open(os.path.join(temp, "ray", "ray_current_cluster"), "w") as f:
            f.write("127.0.0.1:1")
        code = (
            "from esper_ray.train.process.resources import connect_ray; import ray; "
            "connect_ray(None, log=lambda line: None); "
            "print('CPUs', int(ray.cluster_resources()['CPU'])); ray.shutdown()"
        )
        for extra in ({}, {"RAY_ADDRESS": "127.0.0.1:1"}):
            env = {**os.environ, "RAY_TMPDIR": temp, "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled", **extra}
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
            assert run.returncode == 0 and f"CPUs {os.cpu_count()}" in run.stdout, (extra, run.stderr[-2000:])
    finally:
        shutil.rmtree(temp, ignore_errors=True)
