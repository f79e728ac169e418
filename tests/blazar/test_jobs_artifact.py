"""A job's large result is named by where it lies under the data dir and the URL that reads
it, never by the machine's own path (which would show the user's home to any client)."""

from __future__ import annotations

from pathlib import Path

import trio

from actors.jobs import JobContext, JobOutcome
from tests.instant import instant_config, serve_gateway


async def test_a_spilled_result_is_named_relative_to_the_data_dir(instant_home: Path) -> None:
    async def big(ctx: JobContext) -> JobOutcome:
        return JobOutcome(result=b"x" * 5000)

    async with serve_gateway(instant_config()) as gw:
        jobs = gw.runtime.jobs
        jobs.spill_bytes = 1000
        jobs.register("big", big)
        job = await jobs.submit("big", b"")
        for _ in range(400):  # its end is recorded just after the runner returns
            doc = (await gw.client.get(f"/v1/jobs/{job.id}")).json()
            if doc["status"] == "completed":
                break
            await trio.sleep(0.05)
        assert doc["artifact"] == {"path": f"jobs/{job.id}/result", "url": f"/v1/jobs/{job.id}/result"}
        assert str(instant_home) not in (await gw.client.get(f"/v1/jobs/{job.id}")).text
        result = await gw.client.get(doc["artifact"]["url"])
        assert result.status_code == 200 and result.content == b"x" * 5000
