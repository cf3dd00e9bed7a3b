CASE WHEN {1} THEN
    COALESCE((SELECT p.count FROM platformkit.platformkit_limits AS p
              WHERE p.key = a.key AND p.window_start = a.start - a.width), 0)
ELSE 0 END
