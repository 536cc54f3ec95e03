-- 0281: artifacts whose latest verification (`tuneplane artifacts verify`, before 0280) found their stored
-- bytes no longer matching the manifest are marked corrupt as mark_artifact_corrupt would have marked
-- them, so resume does not pick a checkpoint already known to be corrupt (issue 35).
INSERT INTO tuneplane.artifact_corruptions (artifact_id, at, reason, found_by)
SELECT v.artifact_id, v.at,
       coalesce(nullif(left(v.problems ->> 0, 500), ''), 'its stored files do not match the manifest'),
       'a verification by ' || v.requested_by
  FROM (SELECT DISTINCT ON (artifact_id) * FROM tuneplane.artifact_verifications
         ORDER BY artifact_id, id DESC) v
 WHERE NOT v.ok
ON CONFLICT (artifact_id) DO NOTHING;
