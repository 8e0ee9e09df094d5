"""grpc.health.v1.Health/Check as the kubelet's gRPC probe calls it, over a raw gRPC call (no
generated stubs needed: the request and response are one-field messages, encoded here).

The kubelet counts a probe as passed only when Check answers SERVING within timeoutSeconds; any
other status, an error status (NOT_FOUND for an unknown service name) or no answer fails it."""
import time

import grpc

SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
_METHOD = "/grpc.health.v1.Health/Check"


def _encode(service):
    # HealthCheckRequest{string service = 1}: tag 0x0a, length, bytes (empty: no field at all).
    data = service.encode()
    if not data:
        return b""
    length, out = len(data), bytearray([0x0A])
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + data


def _decode(data):
    # HealthCheckResponse{ServingStatus status = 1}: tag 0x08, varint; absent means 0 (UNKNOWN).
    if not data:
        return 0
    if data[0] != 0x08:
        raise ValueError(f"unexpected HealthCheckResponse bytes {data!r}")
    value, shift = 0, 0
    for b in data[1:]:
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return value


def check(target, service="", timeout=1.0):
    """The status Check returns, or the grpc.StatusCode of the error."""
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(_METHOD)
        try:
            return _decode(call(_encode(service), timeout=timeout))
        except grpc.RpcError as e:
            return e.code()


def probe(target, probe_spec):
    """One probe attempt as the kubelet makes it from a container's probe spec."""
    grpc_spec = probe_spec["grpc"]
    return check(target, grpc_spec.get("service", ""),
                 timeout=probe_spec.get("timeoutSeconds", 1)) == SERVING


def wait_until_passes(target, probe_spec, deadline_seconds=None):
    """Probes every periodSeconds until one passes; gives up after failureThreshold failures
    (or deadline_seconds). Returns (passed, seconds waited, last result)."""
    period = probe_spec.get("periodSeconds", 10)
    threshold = probe_spec.get("failureThreshold", 3)
    budget = deadline_seconds if deadline_seconds is not None else period * threshold
    start, last = time.monotonic(), None
    while True:
        grpc_spec = probe_spec["grpc"]
        last = check(target, grpc_spec.get("service", ""),
                     timeout=probe_spec.get("timeoutSeconds", 1))
        if last == SERVING:
            return True, time.monotonic() - start, last
        if time.monotonic() - start > budget:
            return False, time.monotonic() - start, last
        # Poll faster than the kubelet would: the test only needs the first passing moment.
        time.sleep(min(period, 0.5))
