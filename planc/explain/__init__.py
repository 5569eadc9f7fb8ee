"""``planc explain``: the planner's choice as text (:mod:`report`), JSON (:func:`report.to_dict`),
an SVG picture (:mod:`svg`) and an ASCII pipeline timeline (:mod:`timeline`)."""
