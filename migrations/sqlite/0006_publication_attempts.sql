-- Each publication of a generation writes its own object: attempt 1 at the generation's key,
-- attempt k > 1 at "<generation>.<k>". Two requests that publish the same upload at once (two
-- clients saving the same new content) may encode it differently (another delta base, or a
-- base that stopped being ready between them); with one key the later write could replace the
-- bytes the winner's row describes. The counter, taken under the partition's gate before an
-- attempt writes, is how retirement finds every object the attempts may have left.
ALTER TABLE upload_generations ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
