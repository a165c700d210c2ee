"""FakePaymentApi: a real local server that applies each idempotency key once, and its clients."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

import httpx
import pytest

from ptb_fence.testing import (
    FakePaymentApi,
    PaymentError,
    PaymentRequest,
    charge,
    charge_async,
)

pytestmark = [pytest.mark.timeout(60)]

WAIT = 10.0  # seconds; the upper bound of every wait below


def _post(url: str, body: Any, key: "str | None" = None) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    return httpx.post(f"{url}/charges", json=body, headers=headers, timeout=WAIT)


# ----------------------------------------------------------------------------- idempotency


def test_the_same_key_and_body_answer_one_charge() -> None:
    with FakePaymentApi() as pay:
        assert pay.url.startswith("http://127.0.0.1:")
        first = charge(pay.url, "order-7", 100, reference="o7")
        again = charge(pay.url, "order-7", 100, reference="o7")
        assert first == again == {
            "id": "ch_1",
            "amount": 100,
            "currency": "XTR",
            "reference": "o7",
            "idempotency_key": "order-7",
        }
        assert pay.count == 1
        assert pay.charges == [first]
        assert [(r.key, r.status, r.charge_id) for r in pay.requests] == [
            ("order-7", 200, "ch_1"),
            ("order-7", 200, "ch_1"),
        ]
        assert pay.requests[0].body == {"amount": 100, "currency": "XTR", "reference": "o7"}


def test_other_keys_make_other_charges_and_records_are_copies() -> None:
    with FakePaymentApi() as pay:
        a = charge(pay.url, "a", 1, currency="EUR", reference="r")
        b = charge(pay.url, "b", 1, currency="EUR", reference="r")
        c = charge(pay.url, "c", 2)
        assert [a["id"], b["id"], c["id"]] == ["ch_1", "ch_2", "ch_3"]
        assert pay.count == 3
        assert pay.charges_by_key() == {"a": a, "b": b, "c": c}
        assert list(pay.charges_by_key()) == ["a", "b", "c"]
        assert pay.charges_for("r") == [a, b]  # one reference charged twice under two keys
        assert pay.charges_for(None) == [c]
        assert pay.charges_for("nothing") == []
        pay.charges[0]["amount"] = 999
        pay.charges_by_key()["a"]["amount"] = 999
        pay.charges_for("r")[0]["amount"] = 999
        pay.requests.clear()
        assert pay.charges[0]["amount"] == 1
        assert len(pay.requests) == 3


def test_the_same_key_with_other_parameters_answers_409() -> None:
    with FakePaymentApi() as pay:
        charge(pay.url, "k", 100, reference="o1")
        for amount, currency, reference in ((101, "XTR", "o1"), (100, "EUR", "o1"),
                                            (100, "XTR", "o2"), (100, "XTR", None)):
            with pytest.raises(PaymentError, match="409") as caught:
                charge(pay.url, "k", amount, currency=currency, reference=reference)
            assert caught.value.status == 409
            assert caught.value.body["error"]["type"] == "idempotency_error"
        assert pay.count == 1
        assert [r.status for r in pay.requests] == [200, 409, 409, 409, 409]
        assert [r.charge_id for r in pay.requests] == ["ch_1", None, None, None, None]


def test_an_absent_reference_equals_a_null_one() -> None:
    with FakePaymentApi() as pay:
        first = _post(pay.url, {"amount": 5, "currency": "XTR"}, key="k")
        again = _post(pay.url, {"amount": 5, "currency": "XTR", "reference": None}, key="k")
        assert first.status_code == again.status_code == 200
        assert first.json() == again.json()
        assert pay.count == 1


def test_a_missing_key_answers_400_with_a_json_error() -> None:
    with FakePaymentApi() as pay:
        response = _post(pay.url, {"amount": 5, "currency": "XTR"})
        assert response.status_code == 400
        assert response.headers["Content-Type"] == "application/json"
        assert "Idempotency-Key" in response.json()["error"]["message"]
        assert _post(pay.url, {"amount": 5, "currency": "XTR"}, key="").status_code == 400
        assert _post(pay.url, {"amount": 5, "currency": "XTR"}, key="x" * 256).status_code == 400
        assert _post(pay.url, {"amount": 5, "currency": "XTR"}, key="x" * 255).status_code == 200
        assert pay.count == 1
        assert [r.key for r in pay.requests][:1] == [None]
        with pytest.raises(ValueError):
            charge(pay.url, "", 5)


@pytest.mark.parametrize(
    "body",
    [
        [1, 2],
        {"currency": "XTR"},
        {"amount": 0, "currency": "XTR"},
        {"amount": 1.5, "currency": "XTR"},
        {"amount": True, "currency": "XTR"},
        {"amount": 1},
        {"amount": 1, "currency": ""},
        {"amount": 1, "currency": "XTR", "reference": 7},
        {"amount": 1, "currency": "XTR", "metadata": {}},
    ],
)
def test_a_malformed_body_answers_400_and_uses_no_key(body: Any) -> None:
    with FakePaymentApi() as pay:
        response = _post(pay.url, body, key="k")
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert pay.count == 0
        assert charge(pay.url, "k", 1)["id"] == "ch_1"


def test_a_body_that_is_no_json_answers_400_and_is_recorded_as_text() -> None:
    with FakePaymentApi() as pay:
        response = httpx.post(f"{pay.url}/charges", content=b"amount=1",
                              headers={"Idempotency-Key": "k"}, timeout=WAIT)
        assert response.status_code == 400
        assert pay.requests[0].body == "amount=1"


def test_other_routes_and_methods_are_refused_and_recorded() -> None:
    with FakePaymentApi() as pay:
        assert httpx.get(f"{pay.url}/charges", timeout=WAIT).status_code == 405
        assert httpx.post(f"{pay.url}/refunds", json={}, headers={"Idempotency-Key": "k"},
                          timeout=WAIT).status_code == 404
        response = httpx.post(f"{pay.url}/nothing", json={}, timeout=WAIT)
        assert response.status_code == 404
        assert "error" in response.json()
        assert [r.status for r in pay.requests] == [405, 404, 404]
        assert pay.count == 0


def test_twenty_threads_of_one_key_make_one_charge() -> None:
    with FakePaymentApi(delay=0.05) as pay:
        barrier = threading.Barrier(20)
        results: List[Dict[str, Any]] = []
        errors: List[BaseException] = []
        lock = threading.Lock()

        def pay_once() -> None:
            try:
                barrier.wait(timeout=WAIT)
                result = charge(pay.url, "one-key", 300, reference="cart-1", timeout=WAIT)
                with lock:
                    results.append(result)
            except BaseException as error:  # pragma: no cover - reported below
                with lock:
                    errors.append(error)

        threads = [threading.Thread(target=pay_once) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert not errors
        assert len(results) == 20
        assert {result["id"] for result in results} == {"ch_1"}
        assert pay.count == 1
        assert len(pay.requests) == 20
        assert {r.status for r in pay.requests} == {200}


# ----------------------------------------------------------------------------- faults


def test_fail_next_fails_before_any_effect_then_the_retry_charges() -> None:
    with FakePaymentApi() as pay:
        pay.fail_next(2, status=503)
        for _ in range(2):
            with pytest.raises(PaymentError) as caught:
                charge(pay.url, "k", 10)
            assert caught.value.status == 503
            assert caught.value.body["error"]["type"] == "api_error"
        assert pay.count == 0
        assert charge(pay.url, "k", 10)["id"] == "ch_1"
        assert [(r.status, r.charge_id) for r in pay.requests] == [
            (503, None), (503, None), (200, "ch_1")]


def test_fail_next_defaults_to_one_500_and_adds_up() -> None:
    with FakePaymentApi() as pay:
        pay.fail_next()
        pay.fail_next(1, status=429)
        statuses = []
        for _ in range(2):
            with pytest.raises(PaymentError) as caught:
                charge(pay.url, "k", 10)
            statuses.append(caught.value.status)
        assert statuses == [500, 429]
        charge(pay.url, "k", 10)
        assert pay.count == 1


def test_fail_next_comes_before_key_and_body_checks() -> None:
    with FakePaymentApi() as pay:
        pay.fail_next()
        assert _post(pay.url, {"amount": 1, "currency": "XTR"}).status_code == 500
        assert _post(pay.url, {"amount": 1, "currency": "XTR"}).status_code == 400


def test_fault_arguments_are_checked() -> None:
    pay = FakePaymentApi()
    with pytest.raises(ValueError):
        pay.fail_next(0)
    with pytest.raises(ValueError):
        pay.fail_next(1, status=200)
    with pytest.raises(ValueError):
        pay.answer_lost_next(0)
    with pytest.raises(ValueError):
        pay.delay = -1
    with pytest.raises(ValueError):
        FakePaymentApi(delay=-0.1)


def test_a_lost_answer_creates_the_charge_and_the_retry_gets_it() -> None:
    with FakePaymentApi() as pay:
        pay.answer_lost_next()
        with pytest.raises(PaymentError, match="no answer") as caught:
            charge(pay.url, "k", 42, reference="o1")
        assert caught.value.status is None
        assert isinstance(caught.value.__cause__, httpx.HTTPError)
        assert pay.count == 1  # the effect happened
        again = charge(pay.url, "k", 42, reference="o1")
        assert again == pay.charges[0]
        assert pay.count == 1
        assert [(r.status, r.charge_id) for r in pay.requests] == [(None, "ch_1"), (200, "ch_1")]


def test_lost_answers_count_only_requests_that_answer_a_charge() -> None:
    with FakePaymentApi() as pay:
        pay.answer_lost_next(2)
        assert _post(pay.url, {"amount": 1, "currency": "XTR"}).status_code == 400
        # the 400 used up no lost answer: the charge and its replay both lose theirs
        for _ in range(2):
            with pytest.raises(PaymentError):
                charge(pay.url, "k", 1)
        charge(pay.url, "k", 1)
        assert pay.count == 1
        assert [r.status for r in pay.requests] == [400, None, None, 200]


def test_a_failure_comes_before_a_lost_answer() -> None:
    with FakePaymentApi() as pay:
        pay.answer_lost_next()
        pay.fail_next()
        with pytest.raises(PaymentError) as caught:
            charge(pay.url, "k", 1)
        assert caught.value.status == 500
        with pytest.raises(PaymentError) as caught:
            charge(pay.url, "k", 1)
        assert caught.value.status is None
        assert charge(pay.url, "k", 1)["id"] == "ch_1"


def test_a_delayed_answer_comes_after_the_charge_exists() -> None:
    with FakePaymentApi(delay=0.5) as pay:
        assert pay.delay == 0.5
        started = time.monotonic()
        with pytest.raises(PaymentError) as caught:
            charge(pay.url, "k", 1, timeout=0.2)  # the client gives up first
        assert caught.value.status is None
        assert pay.count == 1
        pay.delay = 0
        assert charge(pay.url, "k", 1)["id"] == "ch_1"
        assert time.monotonic() - started < WAIT
        pay.delay = 0.3
        started = time.monotonic()
        charge(pay.url, "k", 1)
        assert time.monotonic() - started >= 0.3


# ----------------------------------------------------------------------------- lifecycle


def test_url_before_start_and_restart_on_the_same_port() -> None:
    pay = FakePaymentApi()
    with pytest.raises(RuntimeError, match="start"):
        pay.url
    assert not pay.running
    with pay:
        assert pay.running
        url = pay.url
        charge(url, "k", 1)
        with pytest.raises(RuntimeError):
            pay.start()
    assert not pay.running
    pay.stop()  # stopping a stopped server does nothing
    with pytest.raises(PaymentError) as caught:
        charge(url, "k", 1, timeout=1)
    assert caught.value.status is None
    with pay:
        assert pay.url == url
        assert charge(url, "k", 1)["id"] == "ch_1"
        assert pay.count == 1


# ----------------------------------------------------------------------------- clients


def test_charge_async_works_and_keeps_the_key() -> None:
    async def main(url: str) -> List[Dict[str, Any]]:
        results = await asyncio.gather(
            *(charge_async(url, "async-key", 7, reference="o", timeout=WAIT) for _ in range(5))
        )
        with pytest.raises(PaymentError) as caught:
            await charge_async(url, "async-key", 8, reference="o")
        assert caught.value.status == 409
        return list(results)

    with FakePaymentApi(delay=0.02) as pay:
        results = asyncio.run(asyncio.wait_for(main(pay.url), WAIT))
        assert {result["id"] for result in results} == {"ch_1"}
        assert pay.count == 1
        pay.answer_lost_next()

        async def lost() -> None:
            with pytest.raises(PaymentError) as caught:
                await charge_async(pay.url, "other", 1)
            assert caught.value.status is None
            assert (await charge_async(pay.url, "other", 1))["id"] == "ch_2"

        asyncio.run(asyncio.wait_for(lost(), WAIT))
        assert pay.count == 2


def test_requests_from_other_processes_are_served() -> None:
    script = (
        "import json, sys\n"
        "from ptb_fence.testing import charge\n"
        "print(json.dumps(charge(sys.argv[1], 'from-a-process', 250, reference=sys.argv[2])))\n"
    )
    with FakePaymentApi() as pay:
        children = [
            subprocess.Popen([sys.executable, "-c", script, pay.url, "order-9"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=30)
            assert child.returncode == 0, err
            outputs.append(json.loads(out))
        assert {output["id"] for output in outputs} == {"ch_1"}
        assert pay.charges_for("order-9") == [outputs[0]]
        assert len(pay.requests) == 3
        assert all(isinstance(r, PaymentRequest) for r in pay.requests)
