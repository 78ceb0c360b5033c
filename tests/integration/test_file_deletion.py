"""A file is not deleted from under a batch that takes it as input and has not ended
(409 ``file_in_use``); once the batch has ended it is. On a database and Redis DB of
its own: no worker validates these batches, so they stay where the test puts them."""

from __future__ import annotations

import io

from sqlalchemy import update

from jobs.core.context import Context
from jobs.core.schema import Batch
from jobs.core.settings import Settings
from jobs.tenants import auth


def test_a_file_a_batch_uses_is_kept_until_the_batch_ends(own_settings: Settings) -> None:
    from api.app import create_app

    ctx = Context(own_settings)
    try:
        key = auth.create_tenant(ctx, "file-deletion")[1]
        c = create_app(own_settings).test_client()
        c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
        line = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", ' \
               b'"body": {"model": "all-MiniLM-L6-v2", "input": "x"}}\n'
        f = c.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(line), "in.jsonl")},
                   content_type="multipart/form-data").get_json()
        b = c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/embeddings",
                                        "completion_window": "24h"})
        assert b.status_code == 200, b.get_data(as_text=True)
        refused = c.delete(f"/v1/files/{f['id']}")
        assert refused.status_code == 409, refused.get_data(as_text=True)
        err = refused.get_json()["error"]
        assert (err["code"], err["param"]) == ("file_in_use", "file_id")
        assert b.get_json()["id"] in err["message"]
        assert c.get(f"/v1/files/{f['id']}/content").data == line  # nothing lost
        with ctx.db.session() as s:
            s.execute(update(Batch).where(Batch.id == b.get_json()["id"])
                      .values(status="completed"))
        gone = c.delete(f"/v1/files/{f['id']}")
        assert gone.status_code == 200 and gone.get_json()["deleted"] is True
        assert c.get(f"/v1/files/{f['id']}").status_code == 404
    finally:
        ctx.close()
