"""One module per analysis of the book, each reading trajectories or captured
residuals and returning tidy DataFrames: token frequency
(:mod:`~depthkit.analyses.frequency`), summaries over layers
(:mod:`~depthkit.analyses.summaries`), part of speech
(:mod:`~depthkit.analyses.part_of_speech`, :mod:`~depthkit.analyses.part_of_speech_filter`),
facts, multiple choice, patching, the residual stream, depth score and early exit."""
