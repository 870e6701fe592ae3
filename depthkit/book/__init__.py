"""Building the book: executing chapters (:mod:`~depthkit.book.runner`), the pages made
from saved results (:mod:`~depthkit.book.pages`), the HTML site
(:mod:`~depthkit.book.site`), publishing (:mod:`~depthkit.book.publish`), reference
runs (:mod:`~depthkit.book.reference`) and their stamps
(:mod:`~depthkit.book.stamps`). :mod:`~depthkit.book.tether` and
:mod:`~depthkit.book.time_shares` run by file path around each chapter kernel and
use the standard library only."""
