from lakehouse_dsr import synth


def test_generation_is_deterministic_and_matches_python_ids(spark):
    a = synth.events_df(spark, 0, 300, users=20, seed=3).orderBy("event_id").collect()
    b = synth.events_df(spark, 0, 300, users=20, seed=3).repartition(3).orderBy("event_id").collect()
    assert a == b
    assert synth.events_df(spark, 0, 300, users=20, seed=4).orderBy("event_id").collect() != a
    users = synth.users_df(spark, 20, seed=3).collect()
    assert [u.user_id for u in users] == [synth.user_id(3, i) for i in range(20)]
    assert {e.user_id for e in a} <= {u.user_id for u in users}
    assert len({u.email for u in users}) == 20


def test_generated_tables(spark, new_lakehouse):
    settings = new_lakehouse(users=30, events=500)
    count = lambda t: spark.table(settings.table(t)).count()  # noqa: E731
    assert count("demo.users") == 30 and count("demo.events") == 500 and count("demo.orders") == 30
    emails = {r.email for r in spark.table(settings.table("demo.newsletter")).collect()}
    user_emails = {r.email for r in spark.table(settings.table("demo.users")).collect()}
    assert emails & user_emails and emails - user_emails  # members and prospects
    appends = spark.sql(f"SELECT count(*) n FROM {settings.table('demo.events')}.snapshots").first().n
    assert appends == 2
    buyers = {r.user_id for r in spark.table(settings.table("demo.orders")).collect()}
    assert user_emails and len(buyers) < 30  # some users have no orders: subjects absent from some tables
