"""turncache on Ray Serve: N engine replicas behind one ingress, with session- and prefix-affine routing.

``turncache serve --replicas N`` runs this package; without ``--replicas`` nothing here is imported and Ray is not
needed. Ray is the optional extra ``turncache[cluster]`` (``ray[serve]``, pinned: the request router API is alpha).

Module map (the first five import no Ray)::

    settings       ClusterSettings: --replicas, --ray-address, --router, --route-imbalance, ...
    prompt_keys    block digests of a rendered prompt: the routing key of a stateless turn
    routing        RoutingTable: session pins, prefix map, in-flight turns per replica; the routing rule
    wire           what travels between ingress and replicas: TurnCall, Served, Failed, ToReplica; ReplicaLostError
    metrics_merge  one Prometheus text from every replica's /metrics, with a replica label
    ray_router     TurncacheRouter: Ray Serve's RequestRouter extension point, deciding through a RoutingTable
    replica        EngineReplica: one engine (model + prefix cache) built by chat.server.main.build_engine
    remote_engine  RemoteEngine: what the ingress's app calls an engine; streams turns from replicas
    ingress        ClusterIngress: chat.server.app.create_app over a RemoteEngine, plus /metrics, /v1/ws, /v1/cluster
    launch         build the Ray Serve application; start or join a Ray cluster; `turncache serve --replicas`

See docs/cluster.md for the routing rule, its thresholds, faults, and what scales.
"""
