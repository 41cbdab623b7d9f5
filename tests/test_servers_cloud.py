"""The source servers the fixtures start answer as the sources expect."""

from __future__ import annotations

from tests.servers.cloud import RabbitMq, S3Bucket, SqsPrefix


def test_moto_serves_s3_and_sqs(s3_bucket: S3Bucket, sqs_prefix: SqsPrefix) -> None:
    s3_bucket.put("a/b/x.json", b"{}")
    listed = s3_bucket.client.list_objects_v2(Bucket=s3_bucket.name, Prefix="a/", Delimiter="/")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["a/b/"]
    url = sqs_prefix.create("q1")
    sqs_prefix.client.send_message(QueueUrl=url, MessageBody="hello")
    got = sqs_prefix.client.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert [m["Body"] for m in got["Messages"]] == ["hello"]


def test_rabbitmq_round_trip(rabbitmq: RabbitMq) -> None:
    queue = rabbitmq.declare("q", [b"m1"])
    conn = rabbitmq.connection()
    try:
        _method, _props, body = conn.channel().basic_get(queue=queue, auto_ack=True)
        assert body == b"m1"
    finally:
        conn.close()
