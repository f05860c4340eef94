"""AG News (Zhang et al. 2015), from its archive's CSV files or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.words import NewsArchive


@dataclass
class AGNews(NewsArchive):
    """AG News (Zhang et al. 2015): 127,600 news articles (title and description) of 4 topics (train and test
    pooled), as word ids of a vocabulary fitted on the clients' training text."""

    name = "ag-news"
    hub = Hub("fancyzhx/ag_news", x="text", y="label")
    folder, classes = "ag_news_csv", 4
    files_text = f"the archive's `{folder}/train.csv` and `test.csv` (class 1-4, title, description)"
