"""Sogou News (Zhang et al. 2015), from its archive's CSV files or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.words import NewsArchive


@dataclass
class SogouNews(NewsArchive):
    """Sogou News (Zhang et al. 2015): 510,000 Chinese news articles in pinyin (title and content) of 5 topics
    (sports, finance, entertainment, automobile, technology; train and test pooled), as word ids of a vocabulary
    fitted on the clients' training text."""

    name = "sogou-news"
    hub = Hub("community-datasets/sogou_news", x="content", y="label", more=("title",))
    folder, classes = "sogou_news_csv", 5
    files_text = f"the archive's `{folder}/train.csv` and `test.csv` (class 1-5, title, content; sogou_news_csv.tar.gz unpacked)"
