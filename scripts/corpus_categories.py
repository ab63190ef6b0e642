"""Which category an eval of the `evals` package belongs to (used by build_corpus.py).

A keyword heuristic on the eval's folder name, with explicit overrides where the
keywords get it wrong; anything unmatched is general knowledge.
"""

from __future__ import annotations


def _rule(category: str, words: str) -> tuple[str, tuple[str, ...]]:
    return category, tuple(words.split())


# Category from the eval's folder name ("-" read as "_"): the first rule with a
# keyword that occurs in the name wins.
CATEGORY_RULES: list[tuple[str, tuple[str, ...]]] = [
    _rule(
        "code",
        """
        sql python code_ regex css json coq_ csharp linq crontab syntax forth
        protocol_buffers unified_patch naughty_strings reverse_shell singlestore
        comp_sci computer_science infiniteloop bitwise base64 wkt context_free_grammar
        formal_grammar automata
        """,
    ),
    _rule(
        "knowledge",
        """
        exams _law laws medical bible talmud manuscripts singer thirukkural famous_novel
        dynasty zodiac country countries
        """,
    ),
    _rule(
        "math",
        """
        math arithmetic algebra equation determinant matri linear probabilit stats calc
        aime euler jee geometry triangle polynomial recurrence sequence series
        binary_operations squares remainder integer derivative sort_numeric
        missing_operators numbers_game points_on_line rectangles path_enclosed
        numeral_systems intersections nfl_point unique_combinations cube_pack
        black_scholes ph_calculation ohm dose melting counting count_ gears physics
        mendelian word_problems solve_for hsl to_hebrew_date beam_analysis viewport
        tempo_to_measure resistor finance_calc taxes discount stock_options
        """,
    ),
    _rule(
        "reasoning",
        """
        logic reason puzzle riddle causal deduct deductive contradict paradox
        counterfactual tracking track_objects shuffled mazes chess connect4 game balls
        seating orientation direction movement cube rubiks tetris mate_in_one backgammon
        poker dice raven pattern corr2cause premature unsolvable born_first
        which_is_heavier islands crossword shape_in_shape body_movement manipulation
        relative blocks block_puzzle pointer_value superficial incontext analog
        ambiguous irrelevant diagrammatic date_calculator day_of_week date_booking
        time_zone leap_day european_date mahjong knot shared_border function_deduction
        stratagems first_letters last_word swap_words reverse rot13 vigenere caesar
        anagram bigrams find_letter invert_word split_chinese complex_replace three_pt
        alternate word_association categorize list_comparison osm_mapping lat_long svg
        ascii simple_charting visual floorplan finger_tracking passing rock_climbing
        """,
    ),
    # rhymes, poems, proverbs, translation... in a named language are language tasks
    _rule(
        "language",
        """
        belarusian korean chinese hebrew icelandic finnish nepali gujarati urdu irish
        polish dutch swedish norwegian afrikaans latin greek persian portuguese italian
        turkish russian ru_ ukraine_gec brazilian spanish french german blackfoot canto
        indonesian iqbal manga
        """,
    ),
    _rule(
        "writing",
        """
        summar rhyme rhyming poem poetry verse iambic proofread gec title sarcasm irony
        rhetorical proverb seo newsology escher joke humor modelgraded multiio
        translation direct_speech abstract research_question
        """,
    ),
    _rule(
        "chat",
        """
        emotional human_safety make_me_say moral override prompt_injection
        twenty_questions romantic approval
        """,
    ),
    _rule(
        "language",
        """
        lexicon grammar homonym homophon homograph synonym antonym spelling syllable
        pronunciation romanization inflection part_of_speech idiom words kana kanji
        plural orthography phonetic transliteration onomatopoeia honorific postposition
        consonant dialect foreign_words loanwords new_words fluency character characters
        numerals number_reading numbers spaces gender kinship russe rucola vocabulary
        hindi_shuddha yaminjeongeum sindarin decimal_units japanese_units
        english_numerals radical gpcs interlingual word_vector
        """,
    ),
]

KNOWLEDGE = "knowledge"  # the default: exams, law, medicine, trivia, ...
# Where the keywords above get it wrong.
CATEGORY_OVERRIDES = {
    "accounting_audit": "knowledge",
    "actors-sequence": "reasoning",
    "chess_piece_count": "reasoning",
    "coqa": "knowledge",
    "dice-rotation-sequence": "reasoning",
    "find_country_from_svg": "reasoning",
    "GOL": "reasoning",
    "imperial_date_to_string": "reasoning",
    "japanese_populer_video_game_title_and_the_publisher": "knowledge",
    "logical_reasoning_letter_series_test": "reasoning",
    "logiqa": "reasoning",
    "ordering_randomised_versionlist": "reasoning",
    "parable-to-moral-match": "reasoning",
    "quartz": "reasoning",
    "raven-matrices": "reasoning",
    "simple-knowledge-mongolian": "knowledge",
    "smiles_to_formula": "knowledge",
    "soc_codes": "knowledge",
    "thirty_six_stratagems": "knowledge",
    "vintage_phone_keyboard_decode": "reasoning",
}


def category_of_eval(name: str) -> str:
    if name in CATEGORY_OVERRIDES:
        return CATEGORY_OVERRIDES[name]
    key = name.lower().replace("-", "_")
    for category, words in CATEGORY_RULES:
        if any(w in key for w in words):
            return category
    return KNOWLEDGE
