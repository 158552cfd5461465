"""The chart's default store URL never carries a credential: a `storage.url` with user info (a password, a token,
a user name, in the URL or in an S3 endpoint) would sit in the operator's Deployment and the `helm test` pod for
anyone who may read them, and the operator refuses such a store for every CompileCache that uses it. The render
stops, names the value and where credentials go, and does not repeat the secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chart.chart import CHART_DIR, NAMESPACE, RELEASE, helm
from tests.operator.specgen import BAD_PORTS, PORT_URLS

SECRET = st.text(alphabet="abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=8, max_size=24)
HOST = st.sampled_from(["redis.cache.svc", "10.0.5.7", "cache.example.com"])


def user_info_urls() -> st.SearchStrategy[tuple[str, str]]:
    """(url, the secret it carries)."""
    redis = st.builds(lambda scheme, user, secret, host: (f"{scheme}://{user}:{secret}@{host}:6379/0", secret),
                      st.sampled_from(["redis", "rediss", "redis-cluster", "rediss-cluster"]),
                      st.sampled_from(["", "default", "app"]), SECRET, HOST)
    token = st.builds(lambda secret, host: (f"rediss://{secret}@{host}:6380/1", secret), SECRET, HOST)
    s3 = st.builds(lambda key, secret, host: (f"s3://bucket/prefix?endpoint=https://{key}:{secret}@{host}:9000",
                                              secret), SECRET, SECRET, HOST)
    return st.one_of(redis, token, s3)


def render(helm_bin: Path, url: str) -> tuple[int, str, str]:
    proc = helm(helm_bin, "template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE,
                "--set-string", "storage.url=" + url.replace(",", "\\,"), check=False)  # a list's comma, escaped
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.helm
@settings(max_examples=8, deadline=None)
@given(case=user_info_urls())
def test_a_store_url_with_user_info_is_refused_without_repeating_it(helm_bin: Path, case: tuple[str, str]) -> None:
    url, secret = case
    code, out, err = render(helm_bin, url)
    assert code == 1, out[-300:]
    assert "storage.url" in err and "storage.credentialsSecret" in err, err
    assert secret not in err and secret not in out


@pytest.mark.helm
@pytest.mark.parametrize("url", ["redis://redis.cache.svc:6379/0", "rediss-cluster://a.example.com:6380",
                                 "s3://bucket/prefix?endpoint=https://minio.example.com:9000&region=eu-west-1",
                                 "file:///var/cache/compilecache"])
def test_a_store_url_without_user_info_renders(helm_bin: Path, url: str) -> None:
    code, out, err = render(helm_bin, url)
    assert code == 0, err
    assert f"--default-storage-url={url}" in out


@pytest.mark.helm
@settings(max_examples=8, deadline=None)
@given(url=st.builds(lambda form, port: form.format(port=port), st.sampled_from(PORT_URLS), BAD_PORTS))
def test_a_store_url_whose_port_is_outside_1_to_65535_is_refused(helm_bin: Path, url: str) -> None:
    """Port 0 or past 65535, the store's, an S3 endpoint's or a Redis Cluster seed's: nothing could reach it, and the
    operator would refuse to start with it."""
    code, out, err = render(helm_bin, url)
    assert code == 1, out[-300:]
    assert "storage.url" in err and "from 1 to 65535" in err, err
