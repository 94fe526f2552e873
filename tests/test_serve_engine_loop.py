"""The engine loop in process (no HTTP): if the engine thread itself dies, every request in
flight ends with an error, /health's flag drops, and later submits are refused at once instead
of waiting for a thread that is gone; the same refusal once the loop has stopped."""
import asyncio

import pytest

pytest.importorskip("fastapi", reason="needs the serve extras (pip install -e '.[serve]')")

from dspine_engine.serve.engine_loop import EngineLoop, ShuttingDownError  # noqa: E402


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_thread_fails_requests_and_refuses_new_ones(tiny_llama):
    from dspine_engine import Engine, SamplingParams

    engine = Engine(tiny_llama, progress=False)  # its own: this test breaks it
    params = SamplingParams(max_tokens=50, ignore_eos=True)

    def broken_step():
        raise RuntimeError("boom")

    async def scenario():
        loop = EngineLoop(engine, max_queue=4)
        loop.start()
        engine.step = broken_step  # a bug of the loop itself (the driver catches batch errors)
        stream = await loop.submit("r1", "hello", params, chat=False)
        outs = await asyncio.wait_for(_all(stream), 10)
        assert not loop.healthy
        with pytest.raises(ShuttingDownError, match="engine loop failed"):
            await asyncio.wait_for(loop.submit("r2", "hello", params, chat=False), 10)
        loop.stop(10)  # as the app's shutdown does; the thread has ended by then
        return outs

    outs = asyncio.run(scenario())
    assert outs[-1].finished and outs[-1].finish_reason == "error"
    assert "RuntimeError: boom" in outs[-1].error


async def _all(stream):
    return [out async for out in stream]


def test_a_stopped_engine_loop_refuses_new_requests(tiny_llama_engine):
    from dspine_engine import SamplingParams

    async def scenario():
        loop = EngineLoop(tiny_llama_engine, max_queue=4)
        loop.start()
        loop.stop(10)
        with pytest.raises(ShuttingDownError, match="shutting down"):
            await asyncio.wait_for(loop.submit("r", "hello", SamplingParams(max_tokens=2),
                                               chat=False), 10)

    asyncio.run(scenario())
