"""TLS on every connection the log makes, against real nats-servers with certificates made here
(trustme): the bulk paths (wire: append_many, replay, follow, fold) and nats-py's (append,
telemetry, get_last, publish/subscribe); refusals that name the setting to fix; mutual TLS."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog, LogError
from eventlog.tls import TlsFiles, TlsSetupError, client_context
from events.fold import fold
from events.subjects import subject_for
from events.synthetic import synthetic_history
from services.config import ENV_NOT_SETTINGS, KEYS, resolve_config
from services.config_values import ConfigError
from services.nats import EmbeddedNats, NatsTlsError, tls_config
from tests.events.builders import Events
from tests.pki import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"), "shoal")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("other-pki"), "other")


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """TLS, clients not verified."""
    tls = pki.server_files(verify_clients=False)
    with EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats-tls"), port=0, tls=tls) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """TLS, clients must present a certificate signed by the CA (`verify`)."""
    tls = pki.server_files(verify_clients=True)
    with EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats-mtls"), port=0, tls=tls) as server:
        yield server


async def connect(url: str, files: TlsFiles) -> EventLog:
    log = await EventLog.connect(NatsEndpoint(url=url, tls=files), ensure=False, wait_seconds=1)
    await log.delete_streams()
    await log.ensure_streams()
    return log


async def exercise_every_path(log: EventLog) -> None:
    """append, append_many, replay, fold, follow, telemetry and get_last, all over `log`'s connections."""
    events = synthetic_history(300)
    seqs = await log.append_many(events[:-1])  # the wire's pipelined path
    assert seqs == list(range(1, 300))
    assert await log.append(events[-1]) == 300  # nats-py's JetStream publish
    replayed = [event async for _, event in log.replay()]  # the wire's ordered reader
    assert replayed == events
    assert (await log.fold()) == fold(enumerate(events, 1))
    found = await log.get_last(subject_for(events[-1]))
    assert found is not None and found[0] == 300
    beat = Events().heartbeat("i1", 0, "decode")
    await log.publish_telemetry(beat)
    await log.flush()
    followed: list[int] = []
    async for seq, _ in log.follow(from_seq=299):  # ended by the caller's log.close()
        followed.append(seq)
        if seq == 300:
            await log.append_many(synthetic_history(301)[-1:])  # arrives live
        if seq == 301:
            break
    assert followed == [299, 300, 301]


async def test_every_path_of_the_log_works_over_tls(tls_server: EmbeddedNats, pki: Pki) -> None:
    assert tls_server.url.startswith("tls://")
    log = await connect(tls_server.url, pki.client_files())
    try:
        await exercise_every_path(log)
    finally:
        await log.close()


async def test_nats_py_publish_subscribe_works_with_the_same_context(tls_server: EmbeddedNats, pki: Pki) -> None:
    nc = await nats.connect(tls_server.url, tls=client_context(pki.client_files()))  # pyright: ignore[reportUnknownMemberType]
    try:
        sub = await nc.subscribe("shoal.test.tls")
        await nc.publish("shoal.test.tls", b"over tls")
        message = await sub.next_msg(timeout=5)
        assert message.data == b"over tls"
    finally:
        await nc.close()


async def test_a_nats_url_upgrades_when_the_server_requires_tls(tls_server: EmbeddedNats, pki: Pki) -> None:
    plain_scheme = tls_server.url.replace("tls://", "nats://")
    log = await connect(plain_scheme, pki.client_files())
    try:
        assert await log.append_many(synthetic_history(3)) == [1, 2, 3]
        assert len([seq async for seq, _ in log.replay()]) == 3
    finally:
        await log.close()


@pytest.mark.parametrize("whose_ca", ["none", "another"])
async def test_a_client_without_the_ca_is_refused_naming_the_ca_setting(
    tls_server: EmbeddedNats, other_pki: Pki, whose_ca: str
) -> None:
    files = TlsFiles() if whose_ca == "none" else other_pki.client_files()
    with pytest.raises(LogError, match=r"certificate is not trusted .*set nats_tls_ca \(env SHOAL_NATS_TLS_CA\)"):
        await asyncio.wait_for(connect(tls_server.url, files), 10)


async def test_tls_asked_of_a_plain_server_is_refused_not_downgraded(nats_url: str, pki: Pki) -> None:
    with pytest.raises(LogError, match="does not offer TLS"):
        await connect(nats_url.replace("nats://", "tls://"), pki.client_files())


async def test_mutual_tls_works_with_a_client_certificate(mtls_server: EmbeddedNats, pki: Pki) -> None:
    log = await connect(mtls_server.url, pki.client_files(with_cert=True))
    try:
        await exercise_every_path(log)
    finally:
        await log.close()


async def test_mutual_tls_refuses_a_client_without_a_certificate(mtls_server: EmbeddedNats, pki: Pki) -> None:
    with pytest.raises(LogError, match=r"requires a client certificate: set nats_tls_cert .* and nats_tls_key"):
        await asyncio.wait_for(connect(mtls_server.url, pki.client_files()), 10)


async def test_mutual_tls_refuses_a_certificate_another_ca_signed(
    mtls_server: EmbeddedNats, pki: Pki, other_pki: Pki
) -> None:
    stranger = TlsFiles(ca=str(pki.ca), cert=str(other_pki.client_cert), key=str(other_pki.client_key))
    with pytest.raises(LogError, match="refused our client certificate"):
        await asyncio.wait_for(connect(mtls_server.url, stranger), 10)


# --- errors a user can cause, before any connection ------------------------------------------


def test_unusable_files_name_their_setting(pki: Pki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(TlsSetupError, match=r"nats_tls_ca \(env SHOAL_NATS_TLS_CA\)='/nowhere/ca.pem': no such file"):
        client_context(TlsFiles(ca="/nowhere/ca.pem"))
    with pytest.raises(TlsSetupError, match=r"nats_tls_ca .*garbage.pem' is not usable .* a PEM CA certificate"):
        client_context(TlsFiles(ca=str(garbage)))
    with pytest.raises(TlsSetupError, match=r"nats_tls_cert .* is set but nats_tls_key .* is not"):
        client_context(TlsFiles(cert=str(pki.client_cert)))
    with pytest.raises(TlsSetupError, match=r"nats_tls_cert .* is not usable .* matching the key"):
        client_context(TlsFiles(cert=str(pki.client_cert), key=str(pki.key)))  # the server's key


async def test_connect_reports_an_unusable_file_as_a_log_error(nats_url: str) -> None:
    with pytest.raises(LogError, match=r"nats_tls_ca .* no such file"):
        await EventLog.connect(NatsEndpoint(url=nats_url, tls=TlsFiles(ca="/nowhere/ca.pem")))


def test_the_embedded_server_needs_a_certificate_to_serve_tls(pki: Pki) -> None:
    with pytest.raises(NatsTlsError, match="set nats_tls_cert and nats_tls_key"):
        tls_config(TlsFiles(ca=str(pki.ca)))
    with pytest.raises(NatsTlsError, match=r"nats_tls_key .* no such file"):
        tls_config(TlsFiles(cert=str(pki.cert), key="/nowhere/key.pem"))
    assert tls_config(TlsFiles()) == ""
    assert '"verify": true' in tls_config(pki.server_files(verify_clients=True))
    assert "verify" not in tls_config(pki.server_files(verify_clients=False))


# --- the settings, and how a runner gets them --------------------------------------------------


def test_the_settings_make_the_endpoint_and_a_runner_reads_it_back_from_its_env(pki: Pki) -> None:
    files = pki.client_files(with_cert=True)
    env = {"SHOAL_NATS_TLS_CA": files.ca, "SHOAL_NATS_TLS_CERT": files.cert, "SHOAL_NATS_TLS_KEY": files.key}
    config = resolve_config({"nats_url": "nats://h:4222"}, env=env).config
    endpoint = config.nats_endpoint
    assert endpoint == NatsEndpoint(url="nats://h:4222", tls=files)
    child = endpoint.child_env()
    # the settings' own names, or one the config knows is not a setting (the identity)
    assert all(name.removeprefix("SHOAL_").lower() in KEYS or name in ENV_NOT_SETTINGS for name in child)
    assert NatsEndpoint.from_env("nats://h:4222", child) == endpoint


def test_a_certificate_without_its_key_is_a_config_error(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"nats_tls_cert=.* set together with nats_tls_key"):
        resolve_config({"nats_tls_cert": str(pki.cert)}, env={})


def test_the_embedded_servers_address_is_tls_once_it_has_a_certificate(pki: Pki) -> None:
    env = {"SHOAL_NATS_TLS_CERT": str(pki.cert), "SHOAL_NATS_TLS_KEY": str(pki.key)}
    assert resolve_config({}, env=env).config.client_nats_url == "tls://127.0.0.1:4222"
    assert resolve_config({}, env={}).config.client_nats_url == "nats://127.0.0.1:4222"
