-- 0065 Rendezvous addresses are unique among live attempts (issue 10, item 14).
--
-- reserve_next gives each attempt rank 0's node address and a port of launch_settings' range; two live
-- attempts on one address must never get the same port (the second torchrun would fail to bind, or worse,
-- join the first one's rendezvous). reserve_next picks a port no live attempt uses there; this partial
-- unique index is the truth behind that rule, and the index reserve_next probes.
--
-- Attempts still `reserved` (their PREPARE, which carries the port, was not sent yet) that share a port
-- with an older live attempt at the same address are moved to a free port first; a duplicate among
-- attempts already preparing or running cannot be moved and makes this migration fail by name.

WITH dup AS (
    SELECT a.id, a.master_addr,
           row_number() OVER (PARTITION BY a.master_addr, a.master_port ORDER BY a.id) AS nth
      FROM tuneplane.attempts a
     WHERE a.state IN ('reserved', 'preparing', 'running', 'stopping') AND a.master_addr IS NOT NULL
), moved AS (
    SELECT d.id,
           (SELECT s.rendezvous_port_base + o
              FROM tuneplane.launch_settings s, generate_series(0, s.rendezvous_port_span - 1) o
             WHERE NOT EXISTS (SELECT 1 FROM tuneplane.attempts b
                                WHERE b.master_addr = d.master_addr AND b.master_port = s.rendezvous_port_base + o
                                  AND b.state IN ('reserved', 'preparing', 'running', 'stopping'))
             ORDER BY o LIMIT 1) AS port
      FROM dup d JOIN tuneplane.attempts a ON a.id = d.id
     WHERE d.nth > 1 AND a.state = 'reserved'
)
UPDATE tuneplane.attempts a SET master_port = moved.port FROM moved WHERE a.id = moved.id;

CREATE UNIQUE INDEX attempts_rendezvous_live ON tuneplane.attempts (master_addr, master_port)
    WHERE state IN ('reserved', 'preparing', 'running', 'stopping');
