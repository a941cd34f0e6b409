"""rpc-server's hostile-input tests (tests/test_rpc_hostile.py), run unchanged against the Java device server:
garbage and truncated frames, silent and flooding connections, oversized frames refused before allocation,
garbage and unknown ext types inside a session, unsafe upload names, a wrong-size copy_in, uploads cut off or
stalled. Imported here, they are collected with this module's hostile_server/make_rpc_server: the Java server.
Left out: the tests of the Python decoder itself (fast path vs. full decoder, planted symlinks in tether_rpc.files).
"""
from __future__ import annotations

import pytest

from fixtures.java_device import start_java_device
from test_rpc_hostile import (  # noqa: F401
    test_a_flood_of_idle_connections_cannot_lock_out_a_client, test_connections_that_never_speak_do_not_block_others,
    test_copy_in_with_the_wrong_size_is_refused_and_drained, test_garbage_inside_a_session_ends_only_that_session,
    test_garbage_is_refused_and_the_server_carries_on, test_hostile_plain_sized_calls_inside_a_session,
    test_oversized_frame_is_refused_before_allocation, test_stalled_upload_is_ended_by_the_idle_timeout,
    test_truncated_frame_then_silence_is_timed_out, test_unknown_ext_type_and_deep_nesting_in_a_session,
    test_unsafe_upload_names_are_refused_and_nothing_is_written, test_upload_cut_off_midway_ends_only_that_session,
    test_fast_path_errors_keep_the_session)


@pytest.fixture(scope="module")
def hostile_server(java_device_build, tmp_path_factory):
    # a short handshake timeout keeps the silent-connection test quick (as for rpc-server)
    server = start_java_device(java_device_build, tmp_path_factory.mktemp("jhostile"), "--handshake-timeout", "1")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def patient_server(java_device_build, tmp_path_factory):
    # ten minutes for a silent connection's hello: a server blocked by one would not answer another client
    server = start_java_device(java_device_build, tmp_path_factory.mktemp("jpatient"), "--handshake-timeout", "600")
    yield server
    server.stop()


@pytest.fixture
def make_rpc_server(make_java_device):
    return make_java_device
