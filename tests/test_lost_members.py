"""gapo.verl_plugin.lost_members: a failed run names the Ray nodes and actors that died, waiting for Ray's verdict only
when the error is a survivor's transport error."""

from gapo.verl_plugin.lost_members import ClusterMemberLost, explain, lost_members

ALIVE = {"NodeID": "a" * 40, "NodeManagerAddress": "10.0.0.1", "Alive": True}
DEAD = {"NodeID": "b" * 40, "NodeManagerAddress": "10.0.0.2", "Alive": False, "DeathReasonMessage": "health check"}
DEAD_ACTOR = {"state": "DEAD", "class_name": "create_colocated_worker_cls.<locals>.WorkerDict", "pid": 4242,
              "node_id": "b" * 40, "death_cause": {}}


def _queries(*answers):
    calls = []

    def query():
        calls.append(1)
        return answers[min(len(calls), len(answers)) - 1]
    return query, calls


def test_a_transport_error_waits_for_the_dead_node_and_names_it():
    query, calls = _queries(([ALIVE, {**DEAD, "Alive": True}], []), ([ALIVE, DEAD], [DEAD_ACTOR]))
    err = RuntimeError("gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:28816")
    found = lost_members(err, wait_s=60, query=query, sleep=lambda s: None)
    assert len(calls) == 2  # looked again until Ray declared the node dead
    assert found == ["node bbbbbbbbbbbb at 10.0.0.2 (health check)", "actor WorkerDict pid 4242 on node bbbbbbbbbbbb"]
    message = str(explain(err, found))
    assert isinstance(explain(err, found), ClusterMemberLost)
    assert "node bbbbbbbbbbbb at 10.0.0.2" in message and "trainer.resume_mode=auto" in message
    assert "Connection closed by peer" in message


def test_the_runs_own_error_is_looked_up_once_without_waiting():
    query, calls = _queries(([ALIVE], []))
    assert lost_members(ValueError("bad reward"), wait_s=60, query=query, sleep=lambda s: None) == []
    assert len(calls) == 1


def test_an_actor_death_is_not_waited_on():
    query, calls = _queries(([ALIVE], [DEAD_ACTOR, {**DEAD_ACTOR, "state": "ALIVE", "pid": 1}]))
    err = RuntimeError("ray.exceptions.ActorDiedError: The actor died unexpectedly")
    assert lost_members(err, wait_s=60, query=query, sleep=lambda s: None) == [
        "actor WorkerDict pid 4242 on node bbbbbbbbbbbb"]
    assert len(calls) == 1


def test_the_wait_is_bounded():
    query, calls = _queries(([ALIVE], []))
    err = RuntimeError("Connection reset by peer")
    assert lost_members(err, wait_s=0.0, query=query, sleep=lambda s: None) == []


def test_the_watchdog_ends_the_run_when_a_node_it_saw_alive_dies(capsys):
    from gapo.verl_plugin.lost_members import NodeWatchdog

    answers = [[ALIVE, {**DEAD, "Alive": True}], [ALIVE, {**DEAD, "Alive": True}], [ALIVE, DEAD]]
    exits = []
    dog = NodeWatchdog(every_s=0, exit=exits.append, nodes=lambda: answers.pop(0))
    dog.run()  # in this thread: polls until the second node is dead, then "exits"
    assert exits == [1] and answers == []
    err = capsys.readouterr().err
    assert "GAPO: the run lost members of its Ray cluster: node bbbbbbbbbbbb at 10.0.0.2" in err
    # a node that was never seen alive (dead before the run) is not the run's loss
    assert NodeWatchdog(nodes=lambda: [ALIVE, DEAD]).check(set()) == []
